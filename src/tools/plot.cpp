// Raster canvas and axes for `moonrun bench --plot` (see plot.h).
#include "tools/plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

// stb_image_write's functions stay private to this file, so another area can include its
// own copy without duplicate symbols.
#define STB_IMAGE_WRITE_STATIC
#define STB_IMAGE_WRITE_IMPLEMENTATION
#include <stb/stb_image_write.h>
#include <stb/stb_easy_font.h>

namespace moonrun::tools {

Canvas::Canvas(int width, int height, Rgb bg) : w_(width), h_(height), px_(size_t(width) * height * 3) {
  fill_rect(0, 0, w_, h_, bg);
}

void Canvas::fill_rect(int x0, int y0, int x1, int y1, Rgb c) {
  x0 = std::clamp(x0, 0, w_), x1 = std::clamp(x1, 0, w_);
  y0 = std::clamp(y0, 0, h_), y1 = std::clamp(y1, 0, h_);
  for (int y = y0; y < y1; ++y)
    for (int x = x0; x < x1; ++x) {
      uint8_t* p = &px_[(size_t(y) * w_ + x) * 3];
      p[0] = c.r, p[1] = c.g, p[2] = c.b;
    }
}

void Canvas::line(double x0, double y0, double x1, double y1, Rgb c, int thickness) {
  const double len = std::max(std::fabs(x1 - x0), std::fabs(y1 - y0));
  const int steps = std::max(1, int(std::ceil(len)));
  const int lo = -(thickness - 1) / 2, hi = thickness / 2;
  for (int i = 0; i <= steps; ++i) {
    const double t = double(i) / steps;
    const int x = int(std::lround(x0 + (x1 - x0) * t)), y = int(std::lround(y0 + (y1 - y0) * t));
    fill_rect(x + lo, y + lo, x + hi + 1, y + hi + 1, c);
  }
}

void Canvas::dot(double x, double y, int r, Rgb c) {
  const int cx = int(std::lround(x)), cy = int(std::lround(y));
  for (int dy = -r; dy <= r; ++dy)
    for (int dx = -r; dx <= r; ++dx)
      if (dx * dx + dy * dy <= r * r + r) fill_rect(cx + dx, cy + dy, cx + dx + 1, cy + dy + 1, c);
}

void Canvas::text(int x, int y, const std::string& s, Rgb c, int scale) {
  // stb_easy_font emits axis-aligned quads (4 vertices of 16 bytes: x, y, z floats + rgba).
  static thread_local std::vector<char> vbuf(1 << 16);
  std::string copy = s;
  unsigned char color[4] = {c.r, c.g, c.b, 255};
  const int quads = stb_easy_font_print(0, 0, copy.data(), color, vbuf.data(), int(vbuf.size()));
  for (int q = 0; q < quads; ++q) {
    float xs[4], ys[4];
    for (int v = 0; v < 4; ++v) {
      const float* f = reinterpret_cast<const float*>(vbuf.data() + (q * 4 + v) * 16);
      xs[v] = f[0], ys[v] = f[1];
    }
    const float qx0 = *std::min_element(xs, xs + 4), qx1 = *std::max_element(xs, xs + 4);
    const float qy0 = *std::min_element(ys, ys + 4), qy1 = *std::max_element(ys, ys + 4);
    fill_rect(x + int(qx0 * scale), y + int(qy0 * scale), x + int(qx1 * scale), y + int(qy1 * scale), c);
  }
}

int Canvas::text_width(const std::string& s, int scale) const {
  std::string copy = s;
  return stb_easy_font_width(copy.data()) * scale;
}

Rgb Canvas::pixel(int x, int y) const {
  const uint8_t* p = &px_[(size_t(y) * w_ + x) * 3];
  return {p[0], p[1], p[2]};
}

Status Canvas::write_png(const std::string& path) const {
  if (!stbi_write_png(path.c_str(), w_, h_, 3, px_.data(), w_ * 3))
    return internal_error(path + ": could not write the PNG");
  return Status::ok();
}

double nice_step(double lo, double hi, int n) {
  const double span = hi - lo;
  if (!(span > 0)) return 1;
  const double raw = span / std::max(n, 1);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * mag) return m * mag;
  return 10 * mag;
}

namespace {

const Rgb kInk{40, 40, 48}, kGrid{228, 228, 234}, kFrame{150, 150, 160};

std::string tick_label(double v, double step) {
  char buf[32];
  if (std::fabs(v) < step * 1e-6) v = 0;
  if (step >= 1 && std::fabs(v) < 1e6)
    std::snprintf(buf, sizeof buf, "%.0f", v);
  else
    std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

}  // namespace

Axes draw_axes(Canvas& c, int left, int top, int right, int bottom, double x_min, double x_max, double y_min,
               double y_max, const std::string& title, const std::string& x_label, const std::string& y_label) {
  if (!(x_max > x_min)) x_max = x_min + 1;
  if (!(y_max > y_min)) y_max = y_min + 1;
  const double xs = nice_step(x_min, x_max, 6), ys = nice_step(y_min, y_max, 5);
  Axes a{left, top, right, bottom, std::floor(x_min / xs) * xs, std::ceil(x_max / xs) * xs,
         std::floor(y_min / ys) * ys, std::ceil(y_max / ys) * ys};
  c.text(left, top - 34, title, kInk, 2);
  c.text(left + c.text_width(title, 2) + 14, top - 34, "(" + y_label + ")", {110, 110, 120}, 2);
  for (double y = a.y_min; y <= a.y_max + ys * 1e-9; y += ys) {
    const int py = int(std::lround(a.py(y)));
    c.fill_rect(left, py, right, py + 1, kGrid);
    const std::string l = tick_label(y, ys);
    c.text(left - 8 - c.text_width(l, 2), py - 6, l, kInk, 2);
  }
  for (double x = a.x_min; x <= a.x_max + xs * 1e-9; x += xs) {
    const int px = int(std::lround(a.px(x)));
    c.fill_rect(px, top, px + 1, bottom, kGrid);
    const std::string l = tick_label(x, xs);
    c.text(px - c.text_width(l, 2) / 2, bottom + 8, l, kInk, 2);
  }
  c.fill_rect(left, top, right, top + 1, kFrame);
  c.fill_rect(left, bottom, right + 1, bottom + 1, kFrame);
  c.fill_rect(left, top, left + 1, bottom, kFrame);
  c.fill_rect(right, top, right + 1, bottom, kFrame);
  c.text(left + (right - left - c.text_width(x_label, 2)) / 2, bottom + 30, x_label, kInk, 2);
  return a;
}

}  // namespace moonrun::tools
