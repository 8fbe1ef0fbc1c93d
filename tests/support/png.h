#pragma once
// Minimal PNG writing for tests, the way the seed's make_png does it (8-bit RGB, filter 0,
// one zlib-compressed IDAT), plus a header-only PNG that declares any size: what a
// decompression bomb looks like before its data.
#include <zlib.h>

#include <cstdint>
#include <string>
#include <vector>

namespace moonrun::testing {

inline void png_chunk(std::vector<uint8_t>& out, const char* tag, const std::vector<uint8_t>& data) {
  const uint32_t n = static_cast<uint32_t>(data.size());
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<uint8_t>(n >> s));
  std::vector<uint8_t> body(tag, tag + 4);
  body.insert(body.end(), data.begin(), data.end());
  out.insert(out.end(), body.begin(), body.end());
  const uint32_t crc = static_cast<uint32_t>(crc32(0, body.data(), static_cast<uInt>(body.size())));
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<uint8_t>(crc >> s));
}

inline std::vector<uint8_t> png_ihdr(uint32_t w, uint32_t h) {
  std::vector<uint8_t> ihdr;
  for (uint32_t v : {w, h})
    for (int s = 24; s >= 0; s -= 8) ihdr.push_back(static_cast<uint8_t>(v >> s));
  ihdr.insert(ihdr.end(), {8, 2, 0, 0, 0});  // 8-bit truecolour
  return ihdr;
}

// rgb [h, w, 3].
inline std::vector<uint8_t> make_png(int w, int h, const std::vector<uint8_t>& rgb) {
  std::vector<uint8_t> rows;
  for (int y = 0; y < h; ++y) {
    rows.push_back(0);
    rows.insert(rows.end(), rgb.begin() + static_cast<size_t>(y) * w * 3, rgb.begin() + static_cast<size_t>(y + 1) * w * 3);
  }
  uLongf n = compressBound(static_cast<uLong>(rows.size()));
  std::vector<uint8_t> z(n);
  compress2(z.data(), &n, rows.data(), static_cast<uLong>(rows.size()), 9);
  z.resize(n);
  std::vector<uint8_t> out = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  png_chunk(out, "IHDR", png_ihdr(w, h));
  png_chunk(out, "IDAT", z);
  png_chunk(out, "IEND", {});
  return out;
}

// The seed's test image: 128 x 128, left half pure red, right half pure blue.
inline std::vector<uint8_t> seed_png() {
  const int w = 128, h = 128;
  std::vector<uint8_t> rgb(static_cast<size_t>(w) * h * 3, 0);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) rgb[(static_cast<size_t>(y) * w + x) * 3 + (x < w / 2 ? 0 : 2)] = 255;
  return make_png(w, h, rgb);
}

// A PNG whose header declares w x h but whose data is a few bytes: no decoder may trust it.
inline std::vector<uint8_t> bomb_png(uint32_t w, uint32_t h) {
  std::vector<uint8_t> out = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  png_chunk(out, "IHDR", png_ihdr(w, h));
  png_chunk(out, "IDAT", {0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01});
  png_chunk(out, "IEND", {});
  return out;
}

inline std::string base64(const std::vector<uint8_t>& bytes) {
  static const char* k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const uint32_t v = (bytes[i] << 16) | (bytes[i + 1] << 8) | bytes[i + 2];
    for (int s = 18; s >= 0; s -= 6) out += k[(v >> s) & 63];
  }
  if (i < bytes.size()) {
    const uint32_t v = (bytes[i] << 16) | (i + 1 < bytes.size() ? bytes[i + 1] << 8 : 0);
    out += k[(v >> 18) & 63];
    out += k[(v >> 12) & 63];
    out += i + 1 < bytes.size() ? k[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

}  // namespace moonrun::testing
