#pragma once
// Image files to pixels, with the size checked before any pixel is decoded: the header's
// declared width x height must fit the caller's pixel budget, so a 40-byte PNG that declares
// 20000 x 20000 is an error, not 1.6 GB of memory. stb_image does the decoding (PNG, JPEG,
// GIF's first frame, BMP, TGA, PSD, PNM, HDR, PIC).
//
// The pixels come out the way the reference processor (PIL) sees the image, as far as the
// K3 processing needs it: RGB, or RGBA when the image has an alpha channel or a transparent
// colour (a palette or grey image with tRNS), which the processor composites later. Known
// differences from PIL: a JPEG decodes with stb's IDCT and chroma upsampling rather than
// libjpeg's (pixel values may differ by a few units); 16-bit grey PNGs are reduced to 8 bits
// by their high byte (PIL clips them instead).
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"

namespace moonrun::vision {

struct ImageHeader {
  std::string format;  // "png", "jpeg", "gif", "bmp", "psd", "hdr", "pnm", "other"
  int width = 0;
  int height = 0;
  bool palette = false;  // a PNG palette image (PIL resamples those with NEAREST)
  int png_color_type = -1;
};

// Reads the header only (format, declared size). Errors: not an image stb can read.
Result<ImageHeader> read_image_header(std::span<const uint8_t> bytes);

struct DecodedImage {
  int width = 0;
  int height = 0;
  int channels = 3;             // 3: RGB; 4: RGBA (alpha to composite)
  bool palette = false;         // see ImageHeader
  std::vector<uint8_t> pixels;  // [height, width, channels]
};

// Decodes after checking width * height <= max_pixels (from the header). Errors are
// one-line messages naming the problem: unknown format, declared size over the budget,
// corrupt or truncated data.
Result<DecodedImage> decode_image(std::span<const uint8_t> bytes, int64_t max_pixels);

}  // namespace moonrun::vision
