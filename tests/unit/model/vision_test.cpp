// The vision path's pieces against what the reference (and PyTorch under it) computes:
// kimi_k3_vision_processing's resize/pad plan, F.interpolate's bilinear and bicubic resizes
// (against their definitions in float64), the tower's RMSNorm eps and config choices, the
// 2-D RoPE layout, the 2x2 merge order, PyTorch's GELU values, the placeholder expansion,
// and the header check that stops a decompression bomb before it is decoded.
#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../../support/png.h"
#include "backend/cpu/vision.h"
#include "model/vision/image_decode.h"
#include "model/vision/moonvit.h"
#include "model/vision/placeholders.h"
#include "model/vision/preprocess.h"
#include "model/vision/vision_config.h"

namespace moonrun {
namespace {

TEST(VisionPlan, TheSeedImageIsPaddedNotResized) {
  // navit_resize_image(128, 128, 14, 2, 65536, 512): scale 1, pad to 140 (a multiple of 28).
  vision::ImageProcessorConfig cfg;
  auto plan = vision::plan_resize(128, 128, cfg);
  ASSERT_TRUE(plan.is_ok());
  EXPECT_EQ(plan->new_width, 128);
  EXPECT_EQ(plan->new_height, 128);
  EXPECT_EQ(plan->pad_width, 12);
  EXPECT_EQ(plan->pad_height, 12);
  EXPECT_EQ(plan->grid_h, 10);
  EXPECT_EQ(plan->grid_w, 10);
  EXPECT_EQ(plan->num_tokens, 25);
}

TEST(VisionPlan, ScalesDownToThePatchLimit) {
  // in_patch_limit 120 on 300 x 200: sqrt(120 / (21 * 14)) = 0.6389 -> 191 x 127, padded to
  // 196 x 140: 14 x 10 patches, 35 tokens (the reference's arithmetic, int() truncating).
  vision::ImageProcessorConfig cfg;
  cfg.in_patch_limit = 120;
  auto plan = vision::plan_resize(300, 200, cfg);
  ASSERT_TRUE(plan.is_ok());
  EXPECT_EQ(plan->new_width, 191);
  EXPECT_EQ(plan->new_height, 127);
  EXPECT_EQ(plan->grid_w, 14);
  EXPECT_EQ(plan->grid_h, 10);
  EXPECT_EQ(plan->num_tokens, 35);
}

TEST(VisionPreprocess, SeedImageValues) {
  auto img = vision::decode_image(testing::seed_png(), 1 << 20);
  ASSERT_TRUE(img.is_ok()) << img.status().to_string();
  auto p = vision::preprocess_image(*img, vision::ImageProcessorConfig{});
  ASSERT_TRUE(p.is_ok());
  ASSERT_EQ(p->num_tokens, 25);
  ASSERT_EQ(p->values.size(), 100u * 3 * 14 * 14);
  // (x / 255 - 0.5) / 0.5: red 255 -> 1, 0 -> -1; the padding (zeros) -> -1. Patch 0 is
  // red: channel 0 all 1, channels 1 and 2 all -1. Patch 9 (top right) holds blue pixels
  // in its first 2 columns, then padding.
  const float* p0 = &p->values[0];
  for (int i = 0; i < 196; ++i) {
    ASSERT_EQ(p0[i], 1.0f);
    ASSERT_EQ(p0[196 + i], -1.0f);
    ASSERT_EQ(p0[392 + i], -1.0f);
  }
  const float* p9 = &p->values[9 * 588];
  EXPECT_EQ(p9[392 + 0], 1.0f);   // blue, x = 126
  EXPECT_EQ(p9[392 + 1], 1.0f);   // blue, x = 127
  EXPECT_EQ(p9[392 + 2], -1.0f);  // padding, x = 128
}

TEST(VisionDecode, DeclaredSizeIsCheckedBeforeDecoding) {
  auto r = vision::decode_image(testing::bomb_png(20000, 20000), 64LL << 20);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("20000x20000"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("--max-image-pixels"), std::string::npos);
}

TEST(VisionDecode, TruncatedPngIsAnError) {
  std::vector<uint8_t> png = testing::seed_png();
  png.resize(png.size() / 2);
  auto r = vision::decode_image(png, 1 << 20);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("png"), std::string::npos) << r.status().message();
}

TEST(VisionTower, BilinearResizeIsTorchs) {
  // F.interpolate(torch.tensor([[[[1., 2.], [3., 4.]]]]), size=(4, 4), mode="bilinear",
  // align_corners=False), as PyTorch prints it.
  const std::vector<float> table = {1, 2, 3, 4};
  const std::vector<float> want = {1.0, 1.25, 1.75, 2.0, 1.5, 1.75, 2.25, 2.5,
                                   2.5, 2.75, 3.25, 3.5, 3.0, 3.25, 3.75, 4.0};
  const std::vector<float> got = bilinear_resize(table, 2, 2, 1, 4, 4);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_FLOAT_EQ(got[i], want[i]) << i;
  // The table's own size is used as it is (the reference skips the resize there).
  EXPECT_EQ(bilinear_resize(table, 2, 2, 1, 2, 2), table);
}

// F.interpolate(..., align_corners=False) written from its definition, in float64 and
// independently of moonvit.cpp: output pixel d of an axis sits at source coordinate
// x = (d + 0.5) * in / out - 0.5 (half-pixel centres); the value is a kernel-weighted sum
// of the samples around x, sample indices outside the table reading the border sample.
//   bilinear: the triangle kernel on the two samples floor(x), floor(x) + 1, with x first
//     clamped at 0 (PyTorch's linear modes);
//   bicubic: Keys' cubic convolution kernel with a = -0.75 (PyTorch's choice) on the four
//     samples floor(x) - 1 .. floor(x) + 2, x not clamped.
double keys_cubic(double s) {
  const double a = -0.75, x = std::fabs(s);
  if (x <= 1) return (a + 2) * x * x * x - (a + 3) * x * x + 1;
  if (x < 2) return a * x * x * x - 5 * a * x * x + 8 * a * x - 4 * a;
  return 0;
}

std::vector<std::pair<int, double>> axis_weights(int in, int out, int dst, bool cubic) {
  double x = (dst + 0.5) * in / out - 0.5;
  std::vector<std::pair<int, double>> w;
  auto clamp = [&](int i) { return std::min(std::max(i, 0), in - 1); };
  if (!cubic) {
    x = std::max(x, 0.0);
    const int i0 = static_cast<int>(std::floor(x));
    w.push_back({clamp(i0), 1 - (x - i0)});
    w.push_back({clamp(i0 + 1), x - i0});
  } else {
    const int i0 = static_cast<int>(std::floor(x));
    for (int k = -1; k <= 2; ++k) w.push_back({clamp(i0 + k), keys_cubic(x - (i0 + k))});
  }
  return w;
}

std::vector<double> interpolate_f64(const std::vector<float>& t, int h0, int w0, int c, int h, int w, bool cubic) {
  std::vector<double> out(static_cast<size_t>(h) * w * c, 0.0);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (const auto& [iy, wy] : axis_weights(h0, h, y, cubic))
        for (const auto& [ix, wx] : axis_weights(w0, w, x, cubic))
          for (int k = 0; k < c; ++k)
            out[(static_cast<size_t>(y) * w + x) * c + k] += wy * wx * t[(static_cast<size_t>(iy) * w0 + ix) * c + k];
  return out;
}

TEST(VisionTower, PositionTableResizeIsFInterpolate) {
  // Tables larger and smaller than the grid, square and not, up in one axis and down in the
  // other, to grids of one patch and of many; 3 channels of distinct values.
  struct Shape { int h0, w0, h, w; };
  const Shape shapes[] = {{8, 8, 10, 10}, {16, 16, 10, 10}, {16, 16, 18, 6}, {12, 6, 10, 14}, {5, 7, 18, 18},
                          {4, 4, 2, 2},   {20, 20, 8, 18},  {10, 10, 3, 30}, {3, 2, 1, 1},   {1, 1, 4, 3}};
  const int C = 3;
  for (const Shape& s : shapes) {
    std::vector<float> table(static_cast<size_t>(s.h0) * s.w0 * C);
    for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<float>(std::sin(0.7 * i) * 2.0 + std::cos(0.13 * i));
    for (bool cubic : {false, true}) {
      const std::vector<float> got = cubic ? bicubic_resize(table, s.h0, s.w0, C, s.h, s.w)
                                           : bilinear_resize(table, s.h0, s.w0, C, s.h, s.w);
      const std::vector<double> want = interpolate_f64(table, s.h0, s.w0, C, s.h, s.w, cubic);
      ASSERT_EQ(got.size(), want.size());
      double worst = 0;
      for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::fabs(got[i] - want[i]));
      EXPECT_LE(worst, 1e-5) << (cubic ? "bicubic " : "bilinear ") << s.h0 << "x" << s.w0 << " -> " << s.h << "x"
                             << s.w;
    }
  }
  // At the table's own size the table itself, in either mode (the reference skips the call).
  std::vector<float> t(4 * 5 * C);
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<float>(i);
  EXPECT_EQ(bicubic_resize(t, 4, 5, C, 4, 5), t);
  EXPECT_EQ(bilinear_resize(t, 4, 5, C, 4, 5), t);
  EXPECT_EQ(resize_pos_table(t, 4, 5, C, 8, 3, PosEmbInterpolation::kBicubic), bicubic_resize(t, 4, 5, C, 8, 3));
  EXPECT_EQ(resize_pos_table(t, 4, 5, C, 8, 3, PosEmbInterpolation::kBilinear), bilinear_resize(t, 4, 5, C, 8, 3));
}

TEST(VisionConfig, TowerNormEpsIsFloat32sWhateverTheCheckpointDtype) {
  // nn.RMSNorm() (eps=None) in the tower: torch's rms_norm computes a bfloat16 or float16
  // input in float32 and adds float32's machine epsilon (toOpMathType, then
  // numeric_limits<float>::epsilon()), not the input dtype's (2^-7 for bfloat16).
  const nlohmann::json vc = {{"vt_hidden_size", 32}, {"vt_num_attention_heads", 2}, {"qkv_hidden_size", 32}};
  for (const char* dtype : {"bfloat16", "float16", "float32", ""}) {
    auto c = parse_vision_config(vc, dtype, 64, "config.json");
    ASSERT_TRUE(c.is_ok()) << c.status().to_string();
    EXPECT_EQ(c->norm_eps, std::numeric_limits<float>::epsilon()) << dtype;
    EXPECT_EQ(c->norm_eps, 1.1920928955078125e-07f) << dtype;  // 2^-23
  }
  EXPECT_FALSE(parse_vision_config(vc, "int8", 64, "config.json").is_ok());
}

TEST(VisionConfig, PositionTableInterpolationMode) {
  nlohmann::json vc = {{"vt_hidden_size", 32}, {"vt_num_attention_heads", 2}, {"qkv_hidden_size", 32}};
  EXPECT_EQ(parse_vision_config(vc, "bfloat16", 64, "c")->pos_emb_interpolation, PosEmbInterpolation::kBilinear);
  vc["pos_emb_interpolation_mode"] = nullptr;  // the reference's default, as when absent
  EXPECT_EQ(parse_vision_config(vc, "bfloat16", 64, "c")->pos_emb_interpolation, PosEmbInterpolation::kBilinear);
  vc["pos_emb_interpolation_mode"] = "bicubic";
  EXPECT_EQ(parse_vision_config(vc, "bfloat16", 64, "c")->pos_emb_interpolation, PosEmbInterpolation::kBicubic);
  vc["pos_emb_interpolation_mode"] = "nearest";
  auto bad = parse_vision_config(vc, "bfloat16", 64, "c");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().to_string().find("vision_config.pos_emb_interpolation_mode"), std::string::npos);
}

TEST(VisionTower, RopeEvenPairsTakeTheColumn) {
  // K3_SPEC: in MoonViT's 2-D RoPE the even pairs take the column index. head_dim 8: pair
  // 0 = column x freq 1, pair 1 = row x freq 1, pairs 2, 3 the same at 10000^-0.5.
  const int d = 8;
  const std::vector<float> t = rope_table(2, 3, d);  // 2 rows x 3 columns
  const float* at = &t[(1 * 3 + 2) * d];              // row 1, column 2
  EXPECT_FLOAT_EQ(at[0], std::cos(2.0f));
  EXPECT_FLOAT_EQ(at[1], std::sin(2.0f));
  EXPECT_FLOAT_EQ(at[2], std::cos(1.0f));
  EXPECT_FLOAT_EQ(at[3], std::sin(1.0f));
  EXPECT_NEAR(at[4], std::cos(2.0f / 100.0f), 1e-6);
  EXPECT_NEAR(at[6], std::cos(1.0f / 100.0f), 1e-6);
}

TEST(VisionTower, MergeOrderIsTheReferencesPermute) {
  // tpool_patch_merger on a 4 x 4 grid: token (0, 0) = patches 0, 1, 4, 5; token (0, 1) =
  // 2, 3, 6, 7; token (1, 0) = 8, 9, 12, 13.
  const std::vector<int32_t> order = merge_order(4, 4, 2, 2);
  const std::vector<int32_t> want = {0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15};
  EXPECT_EQ(order, want);
}

TEST(VisionTower, GeluIsPytorchs) {
  // torch.nn.functional.gelu(x) and gelu(x, approximate="tanh") in float64.
  EXPECT_NEAR(cpu::gelu_exact(1.0f), 0.8413447460685429, 1e-6);
  EXPECT_NEAR(cpu::gelu_tanh(1.0f), 0.8411919906082768, 1e-6);
  EXPECT_NEAR(cpu::gelu_exact(-0.5f), -0.15426876936299344, 1e-6);
  EXPECT_NEAR(cpu::gelu_tanh(-0.5f), -0.15428599017485606, 1e-6);
  EXPECT_NEAR(cpu::gelu_exact(2.5f), 2.4844758366855597, 1e-6);
  EXPECT_NEAR(cpu::gelu_tanh(2.5f), 2.484915733910001, 1e-6);
}

TEST(VisionTower, AttentionStaysInsideEachImage) {
  // Two one-row images: each row attends only to itself, so its output is its own v.
  const int H = 1, d = 2;
  std::vector<float> qkv = {1, 0, 1, 0, 5, 6,    // image 0: q, k, v
                            0, 1, 0, 1, 7, 8};   // image 1
  std::vector<float> rope = {1, 0, 1, 0};        // no rotation
  std::vector<float> out(4);
  const std::vector<int32_t> starts = {0, 1, 2};
  cpu::vision_attention(qkv.data(), rope.data(), starts, H, d, out.data());
  EXPECT_EQ(out, (std::vector<float>{5, 6, 7, 8}));
}

TEST(VisionPlaceholders, OneRunPerImage) {
  const int32_t P = 9;
  const std::vector<int32_t> ids = {1, P, 2, P, 3};
  const std::vector<int> rows = {3, 2};
  auto out = vision::expand_placeholders(ids, P, rows);
  ASSERT_TRUE(out.is_ok());
  EXPECT_EQ(*out, (std::vector<int32_t>{1, P, P, P, 2, P, P, 3}));
  EXPECT_EQ(vision::placeholder_positions(*out, P), (std::vector<int32_t>{1, 2, 3, 5, 6}));
  EXPECT_FALSE(vision::expand_placeholders(ids, P, std::vector<int>{3}).is_ok());
  EXPECT_FALSE(vision::expand_placeholders(ids, P, std::vector<int>{1, 1, 1}).is_ok());
  EXPECT_EQ(vision::image_prompt(128, 128),
            "<|media_begin|>image 128x128<|media_content|><|media_pad|><|media_end|>");
}

}  // namespace
}  // namespace moonrun
