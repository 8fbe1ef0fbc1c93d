#include "model/vision/image_decode.h"

#include <cstring>

// stb_image's functions stay private to this file (another area may include its own copy).
#define STB_IMAGE_STATIC
#define STB_IMAGE_IMPLEMENTATION
#define STBI_NO_STDIO
#define STBI_FAILURE_USERMSG
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#endif
#include <stb/stb_image.h>
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

namespace moonrun::vision {

namespace {

bool starts_with(std::span<const uint8_t> b, const char* magic, size_t n) {
  return b.size() >= n && std::memcmp(b.data(), magic, n) == 0;
}

std::string sniff_format(std::span<const uint8_t> b) {
  if (starts_with(b, "\x89PNG\r\n\x1a\n", 8)) return "png";
  if (starts_with(b, "\xff\xd8\xff", 3)) return "jpeg";
  if (starts_with(b, "GIF8", 4)) return "gif";
  if (starts_with(b, "BM", 2)) return "bmp";
  if (starts_with(b, "8BPS", 4)) return "psd";
  if (starts_with(b, "#?RADIANCE", 10) || starts_with(b, "#?RGBE", 6)) return "hdr";
  if (b.size() >= 2 && b[0] == 'P' && (b[1] == '5' || b[1] == '6')) return "pnm";
  return "other";
}

}  // namespace

Result<ImageHeader> read_image_header(std::span<const uint8_t> bytes) {
  if (bytes.empty()) return invalid_argument("image: no bytes");
  if (bytes.size() > static_cast<size_t>(INT32_MAX)) return invalid_argument("image: larger than 2 GiB");
  ImageHeader h;
  h.format = sniff_format(bytes);
  int comp = 0;
  if (!stbi_info_from_memory(bytes.data(), static_cast<int>(bytes.size()), &h.width, &h.height, &comp))
    return invalid_argument(h.format == "other"
                                ? std::string("image: not a format moonrun reads (PNG, JPEG, GIF, BMP, TGA, PSD, PNM, HDR)")
                                : "image: the " + h.format + " header is corrupt (" + stbi_failure_reason() + ")");
  if (h.format == "png" && bytes.size() > 25) {
    // IHDR is the first chunk: colour type at byte 25 (0 grey, 2 RGB, 3 palette, 4 grey+alpha, 6 RGBA).
    h.png_color_type = bytes[25];
    h.palette = h.png_color_type == 3;
  }
  if (h.width <= 0 || h.height <= 0) return invalid_argument("image: the header declares an empty image");
  return h;
}

Result<DecodedImage> decode_image(std::span<const uint8_t> bytes, int64_t max_pixels) {
  auto over_budget = [&](int64_t w, int64_t h) {
    return invalid_argument("image: " + std::to_string(w) + "x" + std::to_string(h) + " is " + std::to_string(w * h) +
                            " pixels, over the limit of " + std::to_string(max_pixels) + " (--max-image-pixels)");
  };
  // A PNG's declared size straight from IHDR (bytes 16..23, big-endian): stb refuses a
  // header past its own 2^30-byte limit with a vaguer message, and the client should hear
  // which limit it hit.
  if (bytes.size() >= 24 && starts_with(bytes, "\x89PNG\r\n\x1a\n", 8) && std::memcmp(bytes.data() + 12, "IHDR", 4) == 0) {
    auto be32 = [&](size_t at) {
      return (int64_t{bytes[at]} << 24) | (int64_t{bytes[at + 1]} << 16) | (int64_t{bytes[at + 2]} << 8) | bytes[at + 3];
    };
    const int64_t w = be32(16), h = be32(20);
    if (w * h > max_pixels) return over_budget(w, h);
  }
  const ImageHeader h = MR_TRY(read_image_header(bytes));
  const int64_t pixels = static_cast<int64_t>(h.width) * h.height;
  if (pixels > max_pixels) return over_budget(h.width, h.height);
  int w = 0, hh = 0, comp = 0;
  stbi_uc* data = stbi_load_from_memory(bytes.data(), static_cast<int>(bytes.size()), &w, &hh, &comp, 0);
  if (!data)
    return invalid_argument("image: the " + h.format + " data is corrupt or truncated (" + stbi_failure_reason() + ")");
  if (w != h.width || hh != h.height) {
    stbi_image_free(data);
    return invalid_argument("image: the " + h.format + " header and data disagree on the size");
  }
  DecodedImage out;
  out.width = w;
  out.height = hh;
  out.palette = h.palette;
  // PIL's view of the channels: grey and palette images expand to RGB, a transparent
  // colour (tRNS) gives them alpha; an RGB PNG's tRNS is ignored (PIL's compositing returns
  // an RGB image unchanged).
  const bool alpha = (comp == 2 || comp == 4) && h.png_color_type != 2;
  out.channels = alpha ? 4 : 3;
  out.pixels.resize(static_cast<size_t>(pixels) * out.channels);
  for (int64_t i = 0; i < pixels; ++i) {
    const stbi_uc* in = data + i * comp;
    uint8_t* o = out.pixels.data() + i * out.channels;
    if (comp <= 2) {
      o[0] = o[1] = o[2] = in[0];
    } else {
      o[0] = in[0];
      o[1] = in[1];
      o[2] = in[2];
    }
    if (alpha) o[3] = in[comp - 1];
  }
  stbi_image_free(data);
  return out;
}

}  // namespace moonrun::vision
