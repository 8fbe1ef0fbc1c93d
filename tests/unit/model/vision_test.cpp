// The vision path's pieces against what the reference (and PyTorch under it) computes:
// kimi_k3_vision_processing's resize/pad plan, F.interpolate's bilinear resize, the 2-D
// RoPE layout, the 2x2 merge order, PyTorch's GELU values, the placeholder expansion, and
// the header check that stops a decompression bomb before it is decoded.
#include <cmath>

#include <gtest/gtest.h>

#include "../../support/png.h"
#include "backend/cpu/vision.h"
#include "model/vision/image_decode.h"
#include "model/vision/moonvit.h"
#include "model/vision/placeholders.h"
#include "model/vision/preprocess.h"

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
