#include "model/vision/preprocess.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

namespace moonrun::vision {

namespace {

using json = nlohmann::json;

// ---- PIL's resampling (Resample.c), 8 bits per channel --------------------------------

constexpr int kPrecisionBits = 32 - 8 - 2;

double bicubic_filter(double x) {
  constexpr double a = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

// For each output index: the first input index, how many inputs, and their fixed-point
// weights (ksize per output, zero-padded), as PIL's precompute_coeffs +
// normalize_coeffs_8bpc compute them.
struct Coeffs {
  int ksize = 0;
  std::vector<int> xmin, count;
  std::vector<int32_t> k;
};

Coeffs precompute_coeffs(int in_size, int out_size) {
  const double scale = static_cast<double>(in_size) / out_size;
  const double filterscale = std::max(scale, 1.0);
  const double support = 2.0 * filterscale;  // BICUBIC's support is 2
  Coeffs c;
  c.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  c.xmin.resize(out_size);
  c.count.resize(out_size);
  c.k.assign(static_cast<size_t>(out_size) * c.ksize, 0);
  std::vector<double> w(c.ksize);
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = (xx + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    int xmin = static_cast<int>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      w[x] = bicubic_filter((x + xmin - center + 0.5) * ss);
      ww += w[x];
    }
    for (int x = 0; x < xmax; ++x) {
      const double v = ww != 0.0 ? w[x] / ww : w[x];
      c.k[static_cast<size_t>(xx) * c.ksize + x] =
          v < 0 ? static_cast<int32_t>(-0.5 + v * (1 << kPrecisionBits)) : static_cast<int32_t>(0.5 + v * (1 << kPrecisionBits));
    }
    c.xmin[xx] = xmin;
    c.count[xx] = xmax;
  }
  return c;
}

uint8_t clip8(int32_t v) {
  const int32_t s = v >> kPrecisionBits;  // arithmetic shift, as PIL's lookup table index
  return static_cast<uint8_t>(s < 0 ? 0 : s > 255 ? 255 : s);
}

// MULDIV255 of PIL's Convert.c: a * b / 255, rounded.
uint8_t muldiv255(unsigned a, unsigned b) {
  const unsigned tmp = a * b + 128;
  return static_cast<uint8_t>(((tmp >> 8) + tmp) >> 8);
}

// ---- the reference's other steps ------------------------------------------------------

// fill_transparent_bg_with: alpha over the background, in float32, truncated to uint8.
std::vector<uint8_t> composite(const std::vector<uint8_t>& rgba, int width, int height, const TransparentBackground& bg) {
  std::vector<uint8_t> rgb(static_cast<size_t>(width) * height * 3);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      const size_t i = static_cast<size_t>(y) * width + x;
      const uint8_t* p = &rgba[i * 4];
      uint8_t* o = &rgb[i * 3];
      if (bg.pattern == TransparentBackground::Pattern::kNone) {  // convert("RGB"): alpha dropped
        o[0] = p[0], o[1] = p[1], o[2] = p[2];
        continue;
      }
      int back = 0;
      switch (bg.pattern) {
        case TransparentBackground::Pattern::kWhite: back = 255; break;
        case TransparentBackground::Pattern::kBlack: back = 0; break;
        case TransparentBackground::Pattern::kGray: back = 128; break;
        default: {
          const bool gray = (y / bg.square_size + x / bg.square_size) % 2 == (bg.white_on_top_left ? 1 : 0);
          back = gray ? bg.gray_value : bg.white_value;
        }
      }
      const float a = static_cast<float>(p[3]) / 255.0f;
      for (int c = 0; c < 3; ++c) {
        const float v = a * static_cast<float>(p[c]) + (1.0f - a) * static_cast<float>(back);
        o[c] = static_cast<uint8_t>(v);
      }
    }
  }
  return rgb;
}

// Image.resize as PIL runs it for the image's mode: RGBA through premultiplied "RGBa",
// palette images NEAREST, an unchanged size a copy.
std::vector<uint8_t> resize_like_pil(const DecodedImage& im, const std::vector<uint8_t>& pixels, int channels,
                                     int new_width, int new_height) {
  if (new_width == im.width && new_height == im.height) return pixels;
  if (im.palette) return resize_nearest(pixels, im.width, im.height, channels, new_width, new_height);
  if (channels != 4) return resize_bicubic(pixels, im.width, im.height, channels, new_width, new_height);
  std::vector<uint8_t> pre(pixels.size());
  for (size_t i = 0; i < pixels.size(); i += 4) {
    const unsigned alpha = pixels[i + 3];
    for (int c = 0; c < 3; ++c) pre[i + c] = muldiv255(pixels[i + c], alpha);
    pre[i + 3] = pixels[i + 3];
  }
  std::vector<uint8_t> out = resize_bicubic(pre, im.width, im.height, 4, new_width, new_height);
  for (size_t i = 0; i < out.size(); i += 4) {
    const unsigned alpha = out[i + 3];
    if (alpha == 255 || alpha == 0) continue;
    for (int c = 0; c < 3; ++c) out[i + c] = static_cast<uint8_t>(std::min(255u, 255u * out[i + c] / alpha));
  }
  return out;
}

uint64_t fnv1a(const void* data, size_t n, uint64_t h = 0xcbf29ce484222325ull) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

}  // namespace

std::vector<uint8_t> resize_bicubic(const std::vector<uint8_t>& pixels, int width, int height, int channels,
                                    int new_width, int new_height) {
  // Horizontal pass first over the rows the vertical pass reads, then the vertical pass,
  // each rounding to 8 bits, as PIL's ImagingResampleInner.
  const Coeffs hc = precompute_coeffs(width, new_width);
  const Coeffs vc = precompute_coeffs(height, new_height);
  const bool horizontal = new_width != width, vertical = new_height != height;
  const int y_first = vc.xmin[0];
  const int y_last = vc.xmin[new_height - 1] + vc.count[new_height - 1];
  std::vector<uint8_t> tmp;
  const uint8_t* src = pixels.data();
  int src_w = width, row0 = 0;
  if (horizontal) {
    const int rows = vertical ? y_last - y_first : height;
    row0 = vertical ? y_first : 0;
    tmp.resize(static_cast<size_t>(rows) * new_width * channels);
    for (int y = 0; y < rows; ++y) {
      const uint8_t* in = pixels.data() + static_cast<size_t>(y + row0) * width * channels;
      uint8_t* out = tmp.data() + static_cast<size_t>(y) * new_width * channels;
      for (int xx = 0; xx < new_width; ++xx) {
        const int32_t* k = &hc.k[static_cast<size_t>(xx) * hc.ksize];
        for (int c = 0; c < channels; ++c) {
          int32_t ss = 1 << (kPrecisionBits - 1);
          for (int x = 0; x < hc.count[xx]; ++x) ss += in[(x + hc.xmin[xx]) * channels + c] * k[x];
          out[xx * channels + c] = clip8(ss);
        }
      }
    }
    src = tmp.data();
    src_w = new_width;
  }
  if (!vertical) return horizontal ? tmp : pixels;
  std::vector<uint8_t> out(static_cast<size_t>(new_height) * src_w * channels);
  for (int yy = 0; yy < new_height; ++yy) {
    const int32_t* k = &vc.k[static_cast<size_t>(yy) * vc.ksize];
    const int ymin = vc.xmin[yy] - row0;
    for (int x = 0; x < src_w * channels; ++x) {
      int32_t ss = 1 << (kPrecisionBits - 1);
      for (int y = 0; y < vc.count[yy]; ++y) ss += src[static_cast<size_t>(y + ymin) * src_w * channels + x] * k[y];
      out[static_cast<size_t>(yy) * src_w * channels + x] = clip8(ss);
    }
  }
  return out;
}

std::vector<uint8_t> resize_nearest(const std::vector<uint8_t>& pixels, int width, int height, int channels,
                                    int new_width, int new_height) {
  // PIL's ImagingScaleAffine: source index floor((i + 0.5) * in / out), accumulated in double.
  auto table = [](int in, int out) {
    std::vector<int> t(out);
    const double step = static_cast<double>(in) / out;
    double at = step * 0.5;
    for (int i = 0; i < out; ++i, at += step) t[i] = std::min(static_cast<int>(at), in - 1);
    return t;
  };
  const std::vector<int> xs = table(width, new_width), ys = table(height, new_height);
  std::vector<uint8_t> out(static_cast<size_t>(new_width) * new_height * channels);
  for (int y = 0; y < new_height; ++y)
    for (int x = 0; x < new_width; ++x)
      std::memcpy(&out[(static_cast<size_t>(y) * new_width + x) * channels],
                  &pixels[(static_cast<size_t>(ys[y]) * width + xs[x]) * channels], channels);
  return out;
}

Result<ImageProcessorConfig> parse_image_processor_config(const json& m, const std::string& source) {
  if (!m.is_object()) return failed_precondition(source + ": media_proc_cfg must be an object");
  ImageProcessorConfig c;
  auto positive = [&](const char* key, auto& out) -> Status {
    if (!m.contains(key)) return failed_precondition(source + ": media_proc_cfg." + key + " is missing");
    const json& v = m[key];
    if (!v.is_number_integer() || v.get<int64_t>() <= 0 || v.get<int64_t>() > (int64_t{1} << 30))
      return failed_precondition(source + ": media_proc_cfg." + key + " must be a positive integer, got " + v.dump());
    out = v.get<std::remove_reference_t<decltype(out)>>();
    return Status::ok();
  };
  MR_RETURN_IF_ERROR(positive("patch_size", c.patch_size));
  MR_RETURN_IF_ERROR(positive("merge_kernel_size", c.merge_kernel_size));
  MR_RETURN_IF_ERROR(positive("in_patch_limit", c.in_patch_limit));
  MR_RETURN_IF_ERROR(positive("patch_limit_on_one_side", c.patch_limit_on_one_side));
  if (m.contains("fixed_output_tokens") && !m["fixed_output_tokens"].is_null())
    return failed_precondition(source + ": media_proc_cfg.fixed_output_tokens is set; moonrun counts an image's "
                                        "tokens from its patch grid, as the tower produces them");
  for (const char* key : {"image_mean", "image_std"}) {
    const json& v = m.contains(key) ? m[key] : json();
    if (!v.is_array() || v.size() != 3 || !v[0].is_number() || !v[1].is_number() || !v[2].is_number())
      return failed_precondition(source + ": media_proc_cfg." + key + " must be 3 numbers");
    double* dst = std::string(key) == "image_mean" ? c.image_mean : c.image_std;
    for (int i = 0; i < 3; ++i) dst[i] = v[i].get<double>();
  }
  for (double s : c.image_std)
    if (s == 0) return failed_precondition(source + ": media_proc_cfg.image_std has a zero");
  // The reference: no transparent_bg_config -> alpha dropped (convert("RGB")); its
  // fill stage defaults to before_resize.
  TransparentBackground& bg = c.background;
  const std::string stage = m.value("transparent_bg_fill_stage", std::string("before_resize"));
  if (stage != "before_resize" && stage != "after_resize")
    return failed_precondition(source + ": media_proc_cfg.transparent_bg_fill_stage \"" + stage +
                               "\" is not before_resize or after_resize");
  bg.after_resize = stage == "after_resize";
  const json t = m.contains("transparent_bg_config") ? m["transparent_bg_config"] : json();
  if (t.is_null()) {
    bg.pattern = TransparentBackground::Pattern::kNone;
  } else if (!t.is_object()) {
    return failed_precondition(source + ": media_proc_cfg.transparent_bg_config must be an object or null");
  } else {
    const std::string p = t.value("pattern", std::string("black"));
    if (p == "white") bg.pattern = TransparentBackground::Pattern::kWhite;
    else if (p == "black") bg.pattern = TransparentBackground::Pattern::kBlack;
    else if (p == "gray") bg.pattern = TransparentBackground::Pattern::kGray;
    else if (p == "chessboard") bg.pattern = TransparentBackground::Pattern::kChessboard;
    else return failed_precondition(source + ": media_proc_cfg.transparent_bg_config.pattern \"" + p + "\" is unknown");
    bg.square_size = t.value("chessboard_square_size", 16);
    bg.white_on_top_left = t.value("chessboard_square_on_top_left", true);
    bg.white_value = t.value("chessboard_white_value", 255);
    bg.gray_value = t.value("chessboard_gray_value", 200);
    if (bg.square_size <= 0) return failed_precondition(source + ": chessboard_square_size must be positive");
  }
  return c;
}

Result<ImageProcessorConfig> load_image_processor_config(const std::string& model_dir, const VisionConfig& vision) {
  ImageProcessorConfig c;  // the release's values (see the header)
  const std::string path = model_dir + "/preprocessor_config.json";
  std::ifstream in(path);
  if (in) {
    std::stringstream ss;
    ss << in.rdbuf();
    const json j = json::parse(ss.str(), nullptr, false);
    if (j.is_discarded()) return failed_precondition(path + ": not valid JSON");
    c = MR_TRY(parse_image_processor_config(j.contains("media_proc_cfg") ? j["media_proc_cfg"] : j, path));
  }
  if (c.patch_size != vision.patch_size || c.merge_kernel_size != vision.merge_kernel_h ||
      c.merge_kernel_size != vision.merge_kernel_w)
    return failed_precondition(path + ": patch " + std::to_string(c.patch_size) + " / merge " +
                               std::to_string(c.merge_kernel_size) + " disagree with config.json's vision_config");
  return c;
}

Result<ResizePlan> plan_resize(int width, int height, const ImageProcessorConfig& cfg) {
  if (width <= 0 || height <= 0) return invalid_argument("image: empty");
  const int p = cfg.patch_size, side = cfg.patch_limit_on_one_side;
  // Python's arithmetic: // on ints, true division and sqrt in double, int() truncates.
  const double s1 = std::sqrt(static_cast<double>(cfg.in_patch_limit) /
                              (std::max(1.0, static_cast<double>(width / p)) * std::max(1.0, static_cast<double>(height / p))));
  const double s2 = static_cast<double>(side) * p / width;
  const double s3 = static_cast<double>(side) * p / height;
  const double scale = std::min({1.0, s1, s2, s3});
  ResizePlan r;
  r.new_width = std::min(std::max(1, static_cast<int>(width * scale)), side * p);
  r.new_height = std::min(std::max(1, static_cast<int>(height * scale)), side * p);
  const int factor = cfg.merge_kernel_size * p;
  r.pad_height = (factor - r.new_height % factor) % factor;
  r.pad_width = (factor - r.new_width % factor) % factor;
  r.grid_h = (r.new_height + r.pad_height) / p;
  r.grid_w = (r.new_width + r.pad_width) / p;
  const int token_h = r.grid_h / cfg.merge_kernel_size, token_w = r.grid_w / cfg.merge_kernel_size;
  if (token_h * cfg.merge_kernel_size > side || token_w * cfg.merge_kernel_size > side)
    return invalid_argument("image: " + std::to_string(width) + "x" + std::to_string(height) +
                            " does not fit the vision tower's grid of " + std::to_string(side) + " patches a side");
  r.num_tokens = token_h * token_w;
  return r;
}

Result<ImagePatches> preprocess_image(const DecodedImage& image, const ImageProcessorConfig& cfg) {
  const ResizePlan plan = MR_TRY(plan_resize(image.width, image.height, cfg));
  const TransparentBackground& bg = cfg.background;
  // Steps 2 and 3, in the configured order; the result is RGB at new_width x new_height.
  std::vector<uint8_t> rgb;
  if (image.channels == 4 && !bg.after_resize) {
    rgb = resize_like_pil({image.width, image.height, 3, image.palette, {}},
                          composite(image.pixels, image.width, image.height, bg), 3, plan.new_width, plan.new_height);
  } else {
    rgb = resize_like_pil(image, image.pixels, image.channels, plan.new_width, plan.new_height);
    if (image.channels == 4) rgb = composite(rgb, plan.new_width, plan.new_height, bg);
  }

  // Step 4: pad with zeros, normalise, patchify. Each value as numpy computes it:
  // float32(x / 255.0), then in float64 minus the mean and times 1/std, back to float32.
  ImagePatches out;
  out.width = image.width;
  out.height = image.height;
  out.grid_h = plan.grid_h;
  out.grid_w = plan.grid_w;
  out.patch_size = cfg.patch_size;
  out.num_tokens = plan.num_tokens;
  const int p = cfg.patch_size;
  float norm[3][256];
  for (int c = 0; c < 3; ++c) {
    const double std_inv = 1.0 / cfg.image_std[c];
    for (int v = 0; v < 256; ++v) {
      float x = static_cast<float>(v / 255.0);
      x = static_cast<float>(static_cast<double>(x) - cfg.image_mean[c]);
      norm[c][v] = static_cast<float>(static_cast<double>(x) * std_inv);
    }
  }
  out.values.resize(static_cast<size_t>(plan.grid_h) * plan.grid_w * 3 * p * p);
  float* o = out.values.data();
  for (int gy = 0; gy < plan.grid_h; ++gy)
    for (int gx = 0; gx < plan.grid_w; ++gx)
      for (int c = 0; c < 3; ++c)
        for (int py = 0; py < p; ++py)
          for (int px = 0; px < p; ++px) {
            const int y = gy * p + py, x = gx * p + px;
            const bool inside = y < plan.new_height && x < plan.new_width;
            const uint8_t v = inside ? rgb[(static_cast<size_t>(y) * plan.new_width + x) * 3 + c] : 0;
            *o++ = norm[c][v];
          }
  const int32_t grid[2] = {out.grid_h, out.grid_w};
  out.content_hash = fnv1a(out.values.data(), out.values.size() * sizeof(float), fnv1a(grid, sizeof grid));
  return out;
}

}  // namespace moonrun::vision
