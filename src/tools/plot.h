#pragma once
// A small raster canvas (RGB, filled rectangles, anti-alias-free lines, stb_easy_font text)
// and the four charts `moonrun bench --plot` draws: latency per request over the run,
// throughput over time, the inter-token latency histogram, and the latency summary bars.
// Written as PNG with stb_image_write.
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace moonrun::tools {

struct Rgb {
  uint8_t r, g, b;
};

class Canvas {
 public:
  Canvas(int width, int height, Rgb background);
  int width() const { return w_; }
  int height() const { return h_; }
  void fill_rect(int x0, int y0, int x1, int y1, Rgb c);  // inclusive-exclusive
  void line(double x0, double y0, double x1, double y1, Rgb c, int thickness = 1);
  void dot(double x, double y, int radius, Rgb c);
  // Text with its top-left corner at (x, y); scale 1 = stb_easy_font's ~7 px cap height.
  void text(int x, int y, const std::string& s, Rgb c, int scale = 2);
  int text_width(const std::string& s, int scale = 2) const;
  Rgb pixel(int x, int y) const;
  Status write_png(const std::string& path) const;

 private:
  int w_, h_;
  std::vector<uint8_t> px_;  // [h, w, 3]
};

// One panel: a plotting rectangle with axes, ticks and labels mapping data to pixels.
struct Axes {
  int left, top, right, bottom;     // the plotting area in pixels
  double x_min, x_max, y_min, y_max;
  double px(double x) const { return left + (x - x_min) / (x_max - x_min) * (right - left); }
  double py(double y) const { return bottom - (y - y_min) / (y_max - y_min) * (bottom - top); }
};
// Draws the frame, grid, "nice" ticks (1-2-5 steps) and labels; returns the axes with the
// ranges widened to the tick grid.
Axes draw_axes(Canvas& c, int left, int top, int right, int bottom, double x_min, double x_max,
               double y_min, double y_max, const std::string& title, const std::string& x_label,
               const std::string& y_label);

// Steps of 1, 2 or 5 x 10^k that split [lo, hi] into about `n` intervals.
double nice_step(double lo, double hi, int n);

}  // namespace moonrun::tools
