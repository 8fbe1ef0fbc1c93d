#include "server/image_input.h"

#include <algorithm>
#include <cctype>

namespace moonrun::server {

namespace {

bool starts_with_ci(const std::string& s, const char* prefix) {
  const size_t n = std::char_traits<char>::length(prefix);
  if (s.size() < n) return false;
  for (size_t i = 0; i < n; ++i)
    if (std::tolower(static_cast<unsigned char>(s[i])) != prefix[i]) return false;
  return true;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// The format a media type names, in image_decode's sniffed names ("" when moonrun does not
// tie that type to one format: it is then trusted to the bytes).
std::string format_of_media_type(const std::string& type) {
  if (type == "image/png" || type == "image/apng") return "png";
  if (type == "image/jpeg" || type == "image/jpg" || type == "image/pjpeg") return "jpeg";
  if (type == "image/gif") return "gif";
  if (type == "image/bmp" || type == "image/x-bmp" || type == "image/x-ms-bmp") return "bmp";
  return "";
}

int base64_value(unsigned char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

}  // namespace

Result<std::vector<uint8_t>> decode_base64(std::string_view text, size_t max_bytes) {
  // Every 4 characters make 3 bytes: refuse an oversized payload before allocating for it.
  if (text.size() / 4 * 3 > max_bytes + 3)
    return invalid_argument("the image is larger than the server's limit of " + std::to_string(max_bytes) +
                            " bytes (--max-image-bytes)");
  std::vector<uint8_t> out;
  out.reserve(text.size() / 4 * 3 + 3);
  uint32_t acc = 0;
  int bits = 0, padding = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == ' ' || c == '\n' || c == '\r' || c == '\t') continue;
    if (c == '=') {
      ++padding;
      continue;
    }
    const int v = base64_value(c);
    if (v < 0 || padding > 0)
      return invalid_argument("the data is not valid base64 (character " + std::to_string(i) +
                              (v < 0 ? " is not in the base64 alphabet)" : " follows the '=' padding)"));
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<uint8_t>((acc >> bits) & 0xff));
    }
  }
  // 6 leftover bits (one stray character) cannot be the end of base64; 2 or 4 are padding.
  if (bits >= 6 || padding > 2) return invalid_argument("the data is not valid base64 (its length is wrong)");
  if (out.size() > max_bytes)
    return invalid_argument("the image is larger than the server's limit of " + std::to_string(max_bytes) +
                            " bytes (--max-image-bytes)");
  return out;
}

Result<std::vector<uint8_t>> image_bytes_from_url(const std::string& url, const ImageLimits& limits,
                                                  const std::string& where) {
  auto fail = [&](const std::string& why) { return invalid_argument(where + ": " + why); };
  if (starts_with_ci(url, "http://") || starts_with_ci(url, "https://")) {
    if (!limits.allow_urls)
      return fail("http(s) image URLs are refused: the server does not fetch URLs a client names (start it with "
                  "--allow-image-urls to change that); send the image inline as a data: URI "
                  "(data:image/png;base64,...)");
    return fail("fetching image URLs is not supported by this server yet; send the image inline as a data: URI "
                "(data:image/png;base64,...)");
  }
  if (!starts_with_ci(url, "data:"))
    return fail("expected a data: URI (data:image/png;base64,...)" +
                std::string(url.empty() ? "" : ", got a URL of another scheme"));
  const size_t comma = url.find(',');
  if (comma == std::string::npos) return fail("the data: URI has no ',' before its data");
  // "data:" [type] *(";" param) [";base64"] "," payload
  const std::string header = lower(url.substr(5, comma - 5));
  std::vector<std::string> fields;
  for (size_t at = 0;;) {
    const size_t semi = header.find(';', at);
    fields.push_back(header.substr(at, semi == std::string::npos ? std::string::npos : semi - at));
    if (semi == std::string::npos) break;
    at = semi + 1;
  }
  const std::string type = fields.front();
  if (type.rfind("image/", 0) != 0)
    return fail("the data: URI's media type is '" + (type.empty() ? std::string("text/plain (none given)") : type) +
                "', not an image type (image/png, image/jpeg, ...)");
  if (std::find(fields.begin() + 1, fields.end(), "base64") == fields.end())
    return fail("the data: URI is not base64 (expected data:" + type + ";base64,...)");
  auto bytes = decode_base64(std::string_view(url).substr(comma + 1), limits.max_bytes);
  if (!bytes.is_ok()) return fail(bytes.status().message());
  if (bytes->empty()) return fail("the data: URI holds no data");
  // The declared format must be the one the bytes hold, when moonrun can tell.
  const std::string declared = format_of_media_type(type);
  if (!declared.empty()) {
    auto header_info = vision::read_image_header(*bytes);
    if (header_info.is_ok() && header_info->format != "other" && header_info->format != declared)
      return fail("the data: URI says " + type + " but the data is a " + header_info->format + " image");
  }
  return bytes;
}

Result<ImageInputConfig> image_input_config(const std::string& model_dir, const ModelConfig& config) {
  ImageInputConfig c;
  c.processor = MR_TRY(vision::load_image_processor_config(model_dir, config.vision));
  c.placeholder_id = config.media_placeholder_token_id;
  return c;
}

Result<vision::ImagePatches> load_image(const std::string& url, const ImageInputConfig& config,
                                        const std::string& where) {
  const std::vector<uint8_t> bytes = MR_TRY(image_bytes_from_url(url, config.limits, where));
  auto decoded = vision::decode_image(bytes, config.limits.max_pixels);
  if (!decoded.is_ok()) return invalid_argument(where + ": " + decoded.status().message());
  auto patches = vision::preprocess_image(*decoded, config.processor);
  if (!patches.is_ok()) return invalid_argument(where + ": " + patches.status().message());
  return patches;
}

}  // namespace moonrun::server
