#pragma once
// image_url content parts -> the model's image inputs, with every check a hostile request
// needs before any pixel is decoded:
//   - data: URIs only ("data:image/<type>;base64,<data>"); http(s) URLs are refused unless
//     the operator passed --allow-image-urls (a server that fetches what a client names is
//     an SSRF hole), and even then this server does not fetch (it says so);
//   - the media type must be an image type, and agree with the bytes when it names a
//     format moonrun recognises (image/png holding a JPEG is a 400, not a guess);
//   - base64 checked strictly; the decoded size capped (--max-image-bytes) before decoding;
//   - the declared width x height capped (--max-image-pixels) from the header, before
//     decoding: a 20000 x 20000 PNG of a few hundred bytes is a 400, not 1.6 GB of memory;
//   - a truncated or corrupt image is a 400 naming the problem.
// Every error is a request error (400) whose message names the content part.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/config.h"
#include "model/vision/image_decode.h"
#include "model/vision/placeholders.h"
#include "model/vision/preprocess.h"

namespace moonrun::server {

struct ImageLimits {
  bool allow_urls = false;
  int64_t max_pixels = 64LL << 20;
  size_t max_bytes = 20u << 20;
  int max_images = 16;
  // Patches of all of a request's images together: what the tower may take at once
  // (Model::max_image_patches of --chunked-prefill-size).
  int64_t max_patches = int64_t{1} << 40;
};

// What the server needs to take images: the model's processor and placeholder id.
struct ImageInputConfig {
  vision::ImageProcessorConfig processor;
  int32_t placeholder_id = -1;
  ImageLimits limits;
};

// The checkpoint's image processor (DIR/preprocessor_config.json or the release's values) and
// placeholder id; limits at their defaults. Only for a config with a vision tower.
Result<ImageInputConfig> image_input_config(const std::string& model_dir, const ModelConfig& config);

// "data:[type][;base64],payload" -> the image bytes. `where` names the part in errors
// ("messages[0].content[1].image_url").
Result<std::vector<uint8_t>> image_bytes_from_url(const std::string& url, const ImageLimits& limits,
                                                  const std::string& where);

// Standard base64 (RFC 4648, '=' padding optional, ASCII white space ignored) -> bytes;
// any other character is an error. max_bytes caps the decoded size before decoding.
Result<std::vector<uint8_t>> decode_base64(std::string_view text, size_t max_bytes);

// One image_url -> its patches, through the bytes, the header checks, decoding and the
// processor.
Result<vision::ImagePatches> load_image(const std::string& url, const ImageInputConfig& config,
                                        const std::string& where);

}  // namespace moonrun::server
