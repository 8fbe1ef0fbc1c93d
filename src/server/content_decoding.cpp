#include "server/content_decoding.h"

#include <zlib.h>

#include <algorithm>
#include <cctype>

namespace moonrun::server {
namespace {

std::string trim_lower(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  std::string out(s.substr(b, e - b));
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// window_bits: 15 + 32 detects gzip or zlib headers; -15 is raw deflate.
DecodeResult inflate_with_limit(const std::string& in, int window_bits, size_t max_bytes, std::string& out) {
  z_stream zs{};
  if (inflateInit2(&zs, window_bits) != Z_OK) return {500, "cannot initialise zlib"};
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  zs.avail_in = static_cast<uInt>(in.size());
  out.clear();
  char buf[64 * 1024];
  int rc = Z_OK;
  while (true) {
    zs.next_out = reinterpret_cast<Bytef*>(buf);
    zs.avail_out = sizeof buf;
    rc = inflate(&zs, Z_NO_FLUSH);
    const size_t got = sizeof buf - zs.avail_out;
    if (out.size() + got > max_bytes) {
      inflateEnd(&zs);
      return {413, "the decoded request body is larger than the server's limit of " + std::to_string(max_bytes) +
                       " bytes (--max-request-bytes)"};
    }
    out.append(buf, got);
    if (rc == Z_STREAM_END) break;
    if (rc == Z_BUF_ERROR && zs.avail_in == 0) {
      inflateEnd(&zs);
      return {400, "the compressed request body is truncated"};
    }
    if (rc != Z_OK && rc != Z_BUF_ERROR) {
      inflateEnd(&zs);
      return {400, std::string("the compressed request body is corrupt (") + (zs.msg ? zs.msg : "zlib error") + ")"};
    }
  }
  // Concatenated gzip members are legal, but one member is what every client sends; bytes
  // after the end are refused rather than silently dropped.
  const bool trailing = zs.avail_in != 0;
  inflateEnd(&zs);
  if (trailing) return {400, "bytes follow the end of the compressed request body"};
  return {};
}

}  // namespace

DecodeResult decode_content(std::string_view content_encoding, std::string& body, size_t max_bytes) {
  const std::string enc = trim_lower(content_encoding);
  if (enc.empty() || enc == "identity") return {};
  if (enc.find(',') != std::string::npos)
    return {415, "Content-Encoding '" + std::string(content_encoding) + "': only one of gzip, deflate, identity is supported"};
  std::string out;
  if (enc == "gzip" || enc == "x-gzip") {
    DecodeResult r = inflate_with_limit(body, 15 + 16, max_bytes, out);
    if (r.status != 200) return r;
  } else if (enc == "deflate") {
    // RFC 9110's deflate is zlib-wrapped; some clients send raw deflate: try both.
    DecodeResult r = inflate_with_limit(body, 15, max_bytes, out);
    if (r.status == 400) r = inflate_with_limit(body, -15, max_bytes, out);
    if (r.status != 200) return r;
  } else {
    return {415, "Content-Encoding '" + std::string(content_encoding) + "' is not supported (use gzip, deflate or identity)"};
  }
  body.swap(out);
  return {};
}

}  // namespace moonrun::server
