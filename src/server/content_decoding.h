#pragma once
// Content-Encoding of request bodies: identity, gzip (x-gzip) and deflate (zlib-wrapped or
// raw), decoded with a hard limit on the decoded size. A 486 KB gzip body can inflate to
// gigabytes; the limit is checked as the output grows, so at most max_bytes (plus one zlib
// window) is ever held. Other encodings are refused (415), as is a chain of several.
#include <string>
#include <string_view>

namespace moonrun::server {

struct DecodeResult {
  int status = 200;   // 200 ok; 400 corrupt; 413 over the limit; 415 unsupported encoding
  std::string error;  // what went wrong, for the error envelope
};

// Replaces body with its decoding per the Content-Encoding header value (may be "").
DecodeResult decode_content(std::string_view content_encoding, std::string& body, size_t max_bytes);

}  // namespace moonrun::server
