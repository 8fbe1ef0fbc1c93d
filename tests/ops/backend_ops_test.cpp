// Every op of backend/ops.h on the CUDA backend against the CPU backend, on the same inputs
// (llama.cpp's test-backend-ops): CudaOps in fp32 (--dtype float32: every op in fp32, held
// to fp32 rounding) and in bf16 (inputs rounded to bf16 first, so the comparison measures the
// kernel, held to bf16 rounding). The KDA and MLA ops run on a mixed batch: a long prefill,
// a decode token and a short chunk, over state slots and pages out of order, from non-zero
// caches. Each check prints an OPERR line that scripts/gpu-check.sh tabulates.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "../support/host_tensors.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/int4.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/mla/mla_ops.h"
#include "backend/dsa_index_row.h"
#include "model/layers/kda.h"
#include "model/layers/rope.h"
#include "model/vision/moonvit.h"
#include "op_test_util.h"

namespace moonrun {
namespace {

using optest::expect_close;
using optest::expect_exact;

// Both backends, and one input placed on both.
struct Backends {
  cpu::CpuOps cpu;
  std::unique_ptr<Ops> gpu;
  bool f32 = true;
  explicit Backends(bool float32) : f32(float32) {
    auto g = cuda::make_cuda_ops({0, 0.25, float32});
    EXPECT_TRUE(g.is_ok()) << g.status().to_string();
    if (g.is_ok()) gpu = std::move(g).value();
  }
  const char* mode() const { return f32 ? "f32" : "bf16"; }
  // The threshold for an op: fp32 rounding in f32 mode, the stated bf16 one otherwise.
  double tol(double bf16_tol) const { return f32 ? 2e-5 : bf16_tol; }
};

struct Pair {
  Tensor c, g;
};

// Host values on both backends: the GPU copy in `gpu_dtype`; the CPU copy rounded the same way.
Pair put(Backends& b, std::vector<float> v, int64_t rows, int64_t cols, DType gpu_dtype = DType::F32) {
  if (gpu_dtype == DType::BF16) v = optest::bf16_rounded(v);
  return {testing::upload(b.cpu, v, rows, cols), testing::upload(*b.gpu, v, rows, cols, gpu_dtype)};
}
Pair put_i32(Backends& b, const std::vector<int32_t>& v, int64_t rows, int64_t cols) {
  Pair p{b.cpu.alloc(rows, cols, DType::I32, "t"), b.gpu->alloc(rows, cols, DType::I32, "t")};
  b.cpu.upload(p.c, 0, v.data(), v.size() * 4);
  b.gpu->upload(p.g, 0, v.data(), v.size() * 4);
  return p;
}
// An output on both: F32 on the CPU, `gpu_dtype` on the GPU.
Pair out(Backends& b, int64_t rows, int64_t cols, DType gpu_dtype = DType::F32) {
  return {b.cpu.alloc(rows, cols, gpu_dtype == DType::I32 ? DType::I32 : DType::F32, "o"),
          b.gpu->alloc(rows, cols, gpu_dtype, "o")};
}
struct MatrixPair {
  Matrix c, g;
};
MatrixPair put_matrix(Backends& b, const std::vector<float>& w, int out_f, int in_f) {
  Pair p = put(b, w, out_f, in_f, b.gpu->weight_dtype());
  return {Matrix{p.c, {}, out_f, in_f}, Matrix{p.g, {}, out_f, in_f}};
}
double err(Backends& b, const Pair& p) {
  return optest::normalised_error(testing::download(*b.gpu, p.g), testing::download(b.cpu, p.c));
}

class BackendOps : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    REQUIRE_GPU();
    b_ = std::make_unique<Backends>(GetParam());
    ASSERT_TRUE(b_->gpu);
  }
  Backends& b() { return *b_; }
  DType act() const { return b_->gpu->act_dtype(); }
  std::unique_ptr<Backends> b_;
};

std::vector<float> normal(size_t n, uint64_t seed, float sd = 1.0f) { return optest::random_normal(n, seed, sd); }
// Sampled token ids as floats, for expect_exact.
std::vector<float> token_values(const std::vector<SampleResult>& results) {
  std::vector<float> out;
  for (const auto& r : results) out.push_back(static_cast<float>(r.token));
  return out;
}

// ---- dense ------------------------------------------------------------------------------

TEST_P(BackendOps, DenseOps) {
  Backends& B = b();
  const int T = 37, H = 96, V = 300;
  // embedding
  Pair table = put(B, normal(V * H, 1), V, H, B.gpu->weight_dtype());
  ForwardBatch fb;
  std::vector<int32_t> ids;
  for (int t = 0; t < T; ++t) ids.push_back((t * 53 + 7) % V);
  fb.add_seq(ids.data(), T, 0, 0, nullptr, 0);
  const BatchView vc = B.cpu.upload_batch(fb), vg = B.gpu->upload_batch(fb);
  Pair e = out(B, T, H);
  B.cpu.embedding(table.c, 0, vc, e.c);
  B.gpu->embedding(table.g, 0, vg, e.g);
  expect_exact(std::string("embedding_") + B.mode(), "37x96", testing::download(*B.gpu, e.g),
               testing::download(B.cpu, e.c));
  // A vocab-parallel rank's slice (rows [100, 250)): zeros for the ids it does not hold.
  Pair slice = put(B, normal(150 * H, 4), 150, H, B.gpu->weight_dtype());
  Pair es = out(B, T, H);
  B.cpu.embedding(slice.c, 100, vc, es.c);
  B.gpu->embedding(slice.g, 100, vg, es.g);
  expect_exact(std::string("embedding_slice_") + B.mode(), "37x96", testing::download(*B.gpu, es.g),
               testing::download(B.cpu, es.c));
  // copy_cols: a rank's column block of a split LatentMoE row (cols [32, 56) of 96 into 24).
  Pair cc = out(B, T, 24);
  B.cpu.copy_cols(e.c, 32, cc.c, 0, 24);
  B.gpu->copy_cols(e.g, 32, cc.g, 0, 24);
  expect_exact(std::string("copy_cols_") + B.mode(), "37x96[32:56]", testing::download(*B.gpu, cc.g),
               testing::download(B.cpu, cc.c));
  // rmsnorm into F32 and into the act dtype
  Pair x = put(B, normal(T * H, 2, 3.0f), T, H);
  Pair w = put(B, optest::random_uniform(H, 3, 0.5f, 1.5f), 1, H);
  Pair y = out(B, T, H), ya = out(B, T, H, act());
  B.cpu.rmsnorm(x.c, w.c, 1e-6f, y.c);
  B.gpu->rmsnorm(x.g, w.g, 1e-6f, y.g);
  B.cpu.rmsnorm(x.c, w.c, 1e-6f, ya.c);
  B.gpu->rmsnorm(x.g, w.g, 1e-6f, ya.g);
  expect_close(std::string("rmsnorm_") + B.mode(), "37x96", err(B, y), 2e-6);
  expect_close(std::string("rmsnorm_act_") + B.mode(), "37x96", err(B, ya), B.tol(4e-3));
  // linear: act x, weight dtype
  const int O = 200;
  Pair xa = put(B, normal(T * H, 4), T, H, act());
  MatrixPair m = put_matrix(B, normal(O * H, 5, 0.1f), O, H);
  Pair l = out(B, T, O);
  B.cpu.linear(xa.c, m.c, l.c);
  B.gpu->linear(xa.g, m.g, l.g);
  expect_close(std::string("linear_") + B.mode(), "37x96->200", err(B, l), B.tol(1e-5));
  // Four projections of one input (a KDA layer's q, k, v, gate): back to back in one weight
  // buffer and one output buffer, then the same matrices into outputs that are not. 5 and 37
  // tokens, F32 and act outputs.
  for (const int Tn : {5, T}) {
    for (const DType ydt : {DType::F32, act()}) {
      Pair xs = put(B, normal(Tn * H, 8), Tn, H, act());
      Pair wall = put(B, normal(4 * O * H, 9, 0.1f), 4 * O, H, B.gpu->weight_dtype());
      Pair ys = out(B, 4 * Tn, O, ydt), ys_apart = out(B, 8 * Tn, O, ydt);
      for (const bool apart : {false, true}) {
        Matrix wc[4], wg[4];
        Tensor yc[4], yg[4];
        for (int i = 0; i < 4; ++i) {
          wc[i] = Matrix{wall.c.rows_view(i * O, O), {}, O, H};
          wg[i] = Matrix{wall.g.rows_view(i * O, O), {}, O, H};
          const Pair& dst = apart ? ys_apart : ys;
          const int64_t row = (apart ? 2 * i : i) * Tn;  // apart: a gap after each output
          yc[i] = dst.c.rows_view(row, Tn);
          yg[i] = dst.g.rows_view(row, Tn);
        }
        const Matrix* pc[] = {&wc[0], &wc[1], &wc[2], &wc[3]};
        const Matrix* pg[] = {&wg[0], &wg[1], &wg[2], &wg[3]};
        B.cpu.linear_shared_input(xs.c, pc, yc);
        B.gpu->linear_shared_input(xs.g, pg, yg);
        for (int i = 0; i < 4; ++i) {
          const double e = optest::normalised_error(testing::download(*B.gpu, yg[i]), testing::download(B.cpu, yc[i]));
          expect_close(std::string("linear_shared_input_") + (apart ? "apart_" : "") + B.mode(),
                       std::to_string(Tn) + "x96->4x200_" + dtype_name(ydt) + "_" + std::to_string(i), e,
                       ydt == DType::BF16 ? B.tol(4e-3) : B.tol(1e-5));
        }
      }
    }
  }
  // add, mul, sigmoid, gated activations (SiTU and SwiGLU)
  Pair a = put(B, normal(T * H, 6), T, H), c = put(B, normal(T * H, 7), T, H);
  Pair s = out(B, T, H), p = out(B, T, H, act());
  B.cpu.add(a.c, c.c, s.c);
  B.gpu->add(a.g, c.g, s.g);
  expect_exact(std::string("add_") + B.mode(), "37x96", testing::download(*B.gpu, s.g), testing::download(B.cpu, s.c));
  B.cpu.mul(a.c, c.c, p.c);
  B.gpu->mul(a.g, c.g, p.g);
  expect_close(std::string("mul_") + B.mode(), "37x96", err(B, p), B.tol(4e-3));
  B.cpu.sigmoid(a.c);
  B.gpu->sigmoid(a.g);
  expect_close(std::string("sigmoid_") + B.mode(), "37x96", err(B, a), 1e-6);
  // rope_interleaved: 3 heads of width 32, the rope part at cols 16..31 of each
  {
    Pair r = put(B, normal(T * 96, 8), T, 96);
    std::vector<int32_t> positions(T);
    for (int t = 0; t < T; ++t) positions[t] = 7 * t + 3;
    const RopeTable table(16, 10000.0f, RopeScaling{});
    Pair cs = put(B, table.rows(positions), T, 16);
    B.cpu.rope_interleaved(r.c, cs.c, 3, 32, 16);
    B.gpu->rope_interleaved(r.g, cs.g, 3, 32, 16);
    expect_close(std::string("rope_interleaved_") + B.mode(), "37x3x32", err(B, r), 1e-6);
  }
  for (bool situ : {true, false}) {
    const ActivationParams ap{situ, 4.0f, situ ? 25.0f : 0.0f};
    Pair h = out(B, T, H, act());
    B.cpu.gated_activation(c.c, s.c, ap, h.c);
    B.gpu->gated_activation(c.g, s.g, ap, h.g);
    expect_close(std::string(situ ? "situ_" : "swiglu_") + B.mode(), "37x96", err(B, h), B.tol(4e-3));
  }
  // AttnRes mix over 0..3 blocks
  for (int nb : {0, 1, 3}) {
    Pair blocks = put(B, normal((nb + 1) * T * H, 10 + nb, 2.0f), (nb + 1) * T, H);
    Pair wn = put(B, optest::random_uniform(H, 20, 0.5f, 1.5f), 1, H), wp = put(B, normal(H, 21), 1, H);
    Pair mix = out(B, T, H);
    B.cpu.attn_res_mix(x.c, blocks.c, nb, wn.c, wp.c, 1e-5f, mix.c);
    B.gpu->attn_res_mix(x.g, blocks.g, nb, wn.g, wp.g, 1e-5f, mix.g);
    expect_close(std::string("attn_res_mix_") + B.mode(), std::to_string(nb) + "blocks", err(B, mix), 1e-5);
  }
  // gather_rows
  Pair rows = put_i32(B, {5, 0, 36, 5}, 4, 1);
  Pair gth = out(B, 4, H);
  B.cpu.gather_rows(x.c, rows.c.as<int32_t>(), gth.c);
  B.gpu->gather_rows(x.g, rows.g.as<int32_t>(), gth.g);
  expect_exact(std::string("gather_rows_") + B.mode(), "4of37", testing::download(*B.gpu, gth.g),
               testing::download(B.cpu, gth.c));
}

// The row kernels at decode widths, where each has a vectorised kernel besides the general
// one: a token at K3's hidden (7168; 1024 threads of two float4 chunks), 140 rows of 2048
// (256 threads of eight), and 8200 wide (more than 2048 chunks: the general kernel). Token
// 0's embedding row and a full-width gather are compared too.
TEST_P(BackendOps, RowOpsAtDecodeWidths) {
  Backends& B = b();
  struct Shape {
    int rows, width;
  };
  for (const Shape sh : {Shape{1, 7168}, Shape{3, 7168}, Shape{140, 2048}, Shape{2, 8200}}) {
    const std::string name = std::to_string(sh.rows) + "x" + std::to_string(sh.width);
    Pair x = put(B, normal(static_cast<size_t>(sh.rows) * sh.width, 70, 3.0f), sh.rows, sh.width);
    Pair w = put(B, optest::random_uniform(sh.width, 71, 0.5f, 1.5f), 1, sh.width);
    Pair y = out(B, sh.rows, sh.width), ya = out(B, sh.rows, sh.width, act());
    B.cpu.rmsnorm(x.c, w.c, 1e-6f, y.c);
    B.gpu->rmsnorm(x.g, w.g, 1e-6f, y.g);
    B.cpu.rmsnorm(x.c, w.c, 1e-6f, ya.c);
    B.gpu->rmsnorm(x.g, w.g, 1e-6f, ya.g);
    expect_close(std::string("rmsnorm_") + B.mode(), name, err(B, y), 2e-6);
    expect_close(std::string("rmsnorm_act_") + B.mode(), name, err(B, ya), B.tol(4e-3));
    // AttnRes over 6 blocks (K3's deepest mix in the slice) and over 16 (past the
    // vectorised kernel's 16 inputs: the general one).
    for (const int nb : {6, 16}) {
      Pair blocks = put(B, normal(static_cast<size_t>(nb) * sh.rows * sh.width, 72 + nb, 2.0f), nb * sh.rows,
                        sh.width);
      Pair wn = put(B, optest::random_uniform(sh.width, 73, 0.5f, 1.5f), 1, sh.width);
      Pair wp = put(B, normal(sh.width, 74, 0.05f), 1, sh.width);
      Pair mix = out(B, sh.rows, sh.width);
      B.cpu.attn_res_mix(x.c, blocks.c, nb, wn.c, wp.c, 1e-5f, mix.c);
      B.gpu->attn_res_mix(x.g, blocks.g, nb, wn.g, wp.g, 1e-5f, mix.g);
      expect_close(std::string("attn_res_mix_") + B.mode(), name + "_" + std::to_string(nb) + "blocks", err(B, mix),
                   1e-5);
    }
    std::vector<int32_t> picks;
    for (int i = 0; i < sh.rows; ++i) picks.push_back((i * 7 + 3) % sh.rows);
    Pair rows = put_i32(B, picks, sh.rows, 1);
    Pair gth = out(B, sh.rows, sh.width);
    B.cpu.gather_rows(x.c, rows.c.as<int32_t>(), gth.c);
    B.gpu->gather_rows(x.g, rows.g.as<int32_t>(), gth.g);
    expect_exact(std::string("gather_rows_") + B.mode(), name, testing::download(*B.gpu, gth.g),
                 testing::download(B.cpu, gth.c));
  }
  const int V = 50, H = 7168;
  Pair table = put(B, normal(static_cast<size_t>(V) * H, 75), V, H, B.gpu->weight_dtype());
  ForwardBatch fb;
  const int32_t ids[] = {17, 3, 49};
  fb.add_seq(ids, 3, 0, 0, nullptr, 0);
  const BatchView vc = B.cpu.upload_batch(fb), vg = B.gpu->upload_batch(fb);
  Pair e = out(B, 3, H);
  B.cpu.embedding(table.c, 0, vc, e.c);
  B.gpu->embedding(table.g, 0, vg, e.g);
  expect_exact(std::string("embedding_") + B.mode(), "3x7168", testing::download(*B.gpu, e.g),
               testing::download(B.cpu, e.c));
}

// ---- the vision tower ----------------------------------------------------------------------

// GELU in both forms, and the tower's attention over two images of different sizes (rows
// of one must not see the other's) with 2-D RoPE angles as model/vision/moonvit builds them.
TEST_P(BackendOps, VisionOps) {
  Backends& B = b();
  const int T = 61, n = 300;
  Pair x = put(B, normal(T * n, 40, 2.0f), T, n);
  for (bool tanh_approx : {true, false}) {
    Pair y = out(B, T, n, act());
    B.cpu.gelu(x.c, tanh_approx, y.c);
    B.gpu->gelu(x.g, tanh_approx, y.g);
    expect_close(std::string(tanh_approx ? "gelu_tanh_" : "gelu_exact_") + B.mode(), "61x300", err(B, y),
                 B.tol(4e-3));
  }
  // Heads x head size as the towers have them: 3 x 32 (and 2 x 32, the fixture's), one head
  // of 24 and of 128 (the release's size: more than one pair per lane), 4 of 8, 2 of 16.
  const int first = 25;  // images of 25 (5 x 5) and 36 (6 x 6) patches
  const int shapes[][2] = {{3, 32}, {2, 32}, {1, 24}, {1, 128}, {4, 8}, {2, 16}};
  for (const auto& hd : shapes) {
    const int heads = hd[0], d = hd[1];
    Pair qkv = put(B, normal(T * 3 * heads * d, 41 + d), T, 3 * heads * d);
    std::vector<float> rope = rope_table(5, 5, d);
    const std::vector<float> second = rope_table(6, 6, d);
    rope.insert(rope.end(), second.begin(), second.end());
    Pair r = put(B, rope, T, d);
    const std::vector<int32_t> starts = {0, first, T};
    Pair o = out(B, T, heads * d);
    B.cpu.vision_attention(qkv.c, r.c, starts, heads, d, o.c);
    B.gpu->vision_attention(qkv.g, r.g, starts, heads, d, o.g);
    expect_close(std::string("vision_attention_") + B.mode(),
                 "25+36x" + std::to_string(heads) + "x" + std::to_string(d), err(B, o), 2e-5);
  }
}

// The chunked KDA in bf16 mode: bf16 operands into fp32 accumulators (FLA's chunk_kda
// precision), held as a normalised error over every output and state element.
constexpr double kKdaChunkedBf16Tol = 1e-2;

// Rows of width d scaled to norm `scale` (KDA's q and k come out of an L2 norm).
std::vector<float> unit_rows(std::vector<float> v, int d, float scale) {
  for (size_t r = 0; r + d <= v.size(); r += d) {
    double ss = 0;
    for (int i = 0; i < d; ++i) ss += v[r + i] * v[r + i];
    for (int i = 0; i < d; ++i) v[r + i] = static_cast<float>(v[r + i] * scale / std::sqrt(ss));
  }
  return v;
}

// ---- the mixed batch of the attention tests -------------------------------------------

// A 70-token prefill (a full and a partial KDA chunk) in slot 2, one decode token after 37
// in slot 0, a 5-token chunk after 12 in slot 1; pages of 16 tokens out of order.
struct MixedBatch {
  ForwardBatch fb;
  std::vector<std::vector<int32_t>> pages = {{3, 9, 1, 7, 5}, {0, 8, 2}, {6, 4}};
  static constexpr int kPageSize = 16, kPages = 10, kSlots = 3;
  MixedBatch() {
    const std::vector<int32_t> ids(70, 1);
    fb.add_seq(ids.data(), 70, 0, 2, pages[0].data(), 5);
    fb.add_seq(ids.data(), 1, 37, 0, pages[1].data(), 3);
    fb.add_seq(ids.data(), 5, 12, 1, pages[2].data(), 2);
  }
  int n_tokens() const { return fb.n_tokens(); }
};

// d = 32 and 64 take the whole-head decode kernel and, in bf16, the tensor-core chunked one
// (whose warps tile S differently at each width); d = 48 the column-tile decode kernel and the
// fp32 chunked one.
void kda_ops_on_a_mixed_batch(Backends& B, int d) {
  MixedBatch mb;
  const int T = mb.n_tokens(), H = 4, D = H * d, K = 4;
  const std::string rows_x_D = std::to_string(T) + "x" + std::to_string(D);
  const std::string heads_x_d = std::to_string(T * H) + "x" + std::to_string(d);
  const std::string seqs = "3seqs_d" + std::to_string(d), slots = "3slots_d" + std::to_string(d);
  const BatchView vc = B.cpu.upload_batch(mb.fb), vg = B.gpu->upload_batch(mb.fb);
  KdaShape shape;
  shape.num_heads = H;
  shape.head_dim = d;
  shape.conv_kernel = K;
  const int64_t slot_floats = kda_state_floats(shape);
  // State slots with non-zero windows and S (a sequence in the middle of its life).
  std::vector<float> state = normal(MixedBatch::kSlots * slot_floats, 30, 0.3f);
  // short conv (+ SiLU) on the three windows of a slot
  Pair x = put(B, normal(T * D, 31), T, D), w = put(B, normal(D * K, 32, 0.5f), D, K);
  for (bool silu : {true, false}) {
    Pair st = put(B, state, MixedBatch::kSlots, slot_floats);
    Pair y = out(B, T, D);
    B.cpu.short_conv(x.c, w.c, vc, StateLayer{st.c.as<float>(), slot_floats}, silu, y.c);
    B.gpu->short_conv(x.g, w.g, vg, StateLayer{st.g.as<float>(), slot_floats}, silu, y.g);
    expect_close(std::string("short_conv_") + (silu ? "silu_" : "") + B.mode(), rows_x_D, err(B, y), 1e-6);
    expect_close(std::string("short_conv_window_") + B.mode(), slots, err(B, st), 0.0);
  }
  // A decode step (one token a sequence): the windows roll inside the conv's own launch.
  {
    ForwardBatch decode;
    const int32_t one = 1;
    for (int s = 0; s < MixedBatch::kSlots; ++s)
      decode.add_seq(&one, 1, 20 + s, (s + 2) % MixedBatch::kSlots, mb.pages[s].data(), 2);
    const BatchView dc = B.cpu.upload_batch(decode), dg = B.gpu->upload_batch(decode);
    Pair xd = put(B, normal(MixedBatch::kSlots * D, 34), MixedBatch::kSlots, D);
    Pair st = put(B, state, MixedBatch::kSlots, slot_floats);
    for (int step = 0; step < 2; ++step) {  // the second step reads the first's rolled windows
      Pair y = out(B, MixedBatch::kSlots, D);
      B.cpu.short_conv(xd.c, w.c, dc, StateLayer{st.c.as<float>(), slot_floats}, true, y.c);
      B.gpu->short_conv(xd.g, w.g, dg, StateLayer{st.g.as<float>(), slot_floats}, true, y.g);
      expect_close(std::string("short_conv_decode_") + B.mode(), "step" + std::to_string(step) + "_" + seqs, err(B, y),
                   1e-6);
      expect_close(std::string("short_conv_decode_window_") + B.mode(), "step" + std::to_string(step) + "_" + slots,
                   err(B, st), 0.0);
    }
  }
  // l2norm, the two decay gates, the gated norm
  Pair q = put(B, normal(T * D, 33), T, D);
  B.cpu.l2norm_rows(q.c.reshaped(d), 0.17f);
  B.gpu->l2norm_rows(q.g.reshaped(d), 0.17f);
  expect_close(std::string("l2norm_rows_") + B.mode(), heads_x_d, err(B, q), 1e-6);
  Pair A_log = put(B, optest::random_uniform(H, 34, 0.0f, 2.7f), 1, H), dt = put(B, normal(D, 35), 1, D);
  for (float lb : {-5.0f, std::numeric_limits<float>::quiet_NaN()}) {
    Pair g = put(B, normal(T * D, 36), T, D);
    B.cpu.kda_gate(g.c, A_log.c, dt.c, d, lb);
    B.gpu->kda_gate(g.g, A_log.g, dt.g, d, lb);
    expect_close(std::string(std::isnan(lb) ? "kda_gate_softplus_" : "kda_gate_bounded_") + B.mode(), rows_x_D,
                 err(B, g), 1e-6);
  }
  Pair o = put(B, normal(T * D, 37), T, D), gate = put(B, normal(T * D, 38), T, D);
  Pair wn = put(B, optest::random_uniform(d, 39, 0.5f, 1.5f), 1, d);
  Pair gn = out(B, T, D, B.gpu->act_dtype());
  B.cpu.gated_rmsnorm(o.c.reshaped(d), gate.c.reshaped(d), wn.c, 1e-5f, gn.c.reshaped(d));
  B.gpu->gated_rmsnorm(o.g.reshaped(d), gate.g.reshaped(d), wn.g, 1e-5f, gn.g.reshaped(d));
  expect_close(std::string("gated_rmsnorm_") + B.mode(), heads_x_d, err(B, gn), B.tol(4e-3));

  // The recurrence in its three modes, from non-zero S.
  Pair qq = put(B, unit_rows(normal(T * D, 40), d, 1.0f / std::sqrt(32.0f)), T, D);
  Pair kk = put(B, unit_rows(normal(T * D, 41), d, 1.0f), T, D);
  Pair vv = put(B, normal(T * D, 42), T, D);
  Pair gg = put(B, optest::random_uniform(T * D, 43, -5.0f, 0.0f), T, D);
  Pair bb = put(B, optest::random_uniform(T * H, 44, 0.0f, 1.0f), T, H);
  for (KdaMode mode : {KdaMode::kAuto, KdaMode::kRecurrent, KdaMode::kChunked}) {
    const char* name = mode == KdaMode::kAuto ? "auto" : mode == KdaMode::kRecurrent ? "recurrent" : "chunked";
    Pair st = put(B, state, MixedBatch::kSlots, slot_floats);
    Pair oo = out(B, T, D);
    const int64_t s_off = kda_s_offset(shape);
    B.cpu.kda_recurrence(qq.c, kk.c, vv.c, gg.c, bb.c, vc, StateLayer{st.c.as<float>() + s_off, slot_floats}, H, d,
                         mode, oo.c);
    B.gpu->kda_recurrence(qq.g, kk.g, vv.g, gg.g, bb.g, vg, StateLayer{st.g.as<float>() + s_off, slot_floats}, H, d,
                          mode, oo.g);
    // bf16 mode chunks on the tensor cores (bf16 operands); the token-by-token form stays fp32.
    const double tol = mode == KdaMode::kRecurrent ? 2e-5 : B.tol(kKdaChunkedBf16Tol);
    expect_close(std::string("kda_recurrence_") + name + "_" + B.mode(), seqs, err(B, oo), tol);
    expect_close(std::string("kda_state_") + name + "_" + B.mode(), slots, err(B, st), tol);
  }
}

// CudaOps reads MOONRUN_FUSED_ROLLBACK at each call: on for one test.
struct FusedRollbackOn {
  FusedRollbackOn() { setenv("MOONRUN_FUSED_ROLLBACK", "1", 1); }
  ~FusedRollbackOn() { unsetenv("MOONRUN_FUSED_ROLLBACK"); }
};

// Speculative decoding's rollback inputs (Ops::kda_replay_inputs): CUDA's one-launch kernel
// against the unfused CUDA ops it replaces (gather_rows, short_conv, l2norm_rows: bit for
// bit, or the replayed state would drift from a forward's) and against the CPU. Three
// sequences replay 1, 3 and 6 tokens from saved rows out of order, in slots out of order,
// from non-zero windows; head widths 32 (one channel a lane), 48 (a partial second) and 128 (K3).
void kda_replay_inputs_match(Backends& B, int d) {
  const int H = 3, D = H * d, K = 4, capacity = 16, slots = 3;
  KdaShape shape;
  shape.num_heads = H;
  shape.head_dim = d;
  shape.conv_kernel = K;
  const int64_t slot_floats = kda_state_floats(shape), window = kda_conv_window_floats(shape);
  ForwardBatch fb;
  const int32_t page = 0;
  const std::vector<int32_t> ids(6, 1);
  fb.add_seq(ids.data(), 3, 40, 2, &page, 1);
  fb.add_seq(ids.data(), 1, 17, 0, &page, 1);
  fb.add_seq(ids.data(), 6, 9, 1, &page, 1);
  const int T = fb.n_tokens();
  const std::vector<int32_t> rows = {11, 0, 5, 14, 2, 9, 8, 3, 15, 6};  // replayed token t reads saved row rows[t]
  ASSERT_EQ(static_cast<int>(rows.size()), T);
  const BatchView vc = B.cpu.upload_batch(fb), vg = B.gpu->upload_batch(fb);
  const std::vector<float> state = normal(slots * slot_floats, 60, 0.3f);
  Pair saved[5], conv[3];
  for (int i = 0; i < 5; ++i) saved[i] = put(B, normal(capacity * (i == 4 ? H : D), 61 + i), capacity, i == 4 ? H : D);
  for (int i = 0; i < 3; ++i) conv[i] = put(B, normal(D * K, 66 + i, 0.5f), D, K);
  Pair index = put_i32(B, rows, T, 1);
  auto run = [&](Ops& ops, bool cpu, bool fused, std::vector<std::vector<float>>& got) {
    const Tensor st = testing::upload(ops, state, slots, slot_floats);
    Ops::KdaReplayInputs r;
    for (int i = 0; i < 5; ++i) r.saved[i] = cpu ? saved[i].c : saved[i].g;
    for (int i = 0; i < 3; ++i) {
      r.conv[i] = cpu ? conv[i].c : conv[i].g;
      r.window[i] = StateLayer{st.as<float>() + i * window, slot_floats};
    }
    r.rows = cpu ? index.c : index.g;
    r.head_dim = d;
    r.q_scale = 1.0f / std::sqrt(static_cast<float>(d));
    for (int i = 0; i < 5; ++i) r.out[i] = ops.alloc(T, i == 4 ? H : D, DType::F32, "o");
    const BatchView& v = cpu ? vc : vg;
    if (fused) ops.kda_replay_inputs(r, v);
    else ops.Ops::kda_replay_inputs(r, v);
    got.clear();
    for (int i = 0; i < 5; ++i) got.push_back(testing::download(ops, r.out[i]));
    got.push_back(testing::download(ops, st));
  };
  std::vector<std::vector<float>> fused, unfused, cpu;
  run(*B.gpu, false, true, fused);
  run(*B.gpu, false, false, unfused);
  run(B.cpu, true, false, cpu);
  const char* names[] = {"q", "k", "v", "g", "beta", "windows"};
  const std::string shape_name = "3seqs_" + std::to_string(T) + "tok_d" + std::to_string(d);
  for (int i = 0; i < 6; ++i) {
    expect_exact(std::string("kda_replay_inputs_") + names[i] + "_vs_unfused_" + B.mode(), shape_name, fused[i],
                 unfused[i]);
    expect_close(std::string("kda_replay_inputs_") + names[i] + "_vs_cpu_" + B.mode(), shape_name,
                 optest::normalised_error(fused[i], cpu[i]), i == 3 || i == 4 ? 0.0 : 1e-6);
  }
}

TEST_P(BackendOps, KdaReplayInputsInOneLaunch) {
  const FusedRollbackOn on;
  for (int d : {32, 48, 128}) kda_replay_inputs_match(b(), d);
}

// copy_many: five copies of a verify step's saves in one launch, against copy() one by one;
// and a pair that is not 16-byte words (the one-by-one fallback).
TEST_P(BackendOps, CopyManyEqualsCopies) {
  const FusedRollbackOn on;
  Backends& B = b();
  std::vector<Tensor> src, dst;
  std::vector<std::vector<float>> want;
  const int64_t cols[] = {64, 256, 12, 96, 3};
  for (int i = 0; i < 5; ++i) {
    want.push_back(normal(7 * cols[i], 80 + i));
    src.push_back(testing::upload(*B.gpu, want.back(), 7, cols[i]));
    dst.push_back(B.gpu->alloc(7, cols[i], DType::F32, "o"));
  }
  B.gpu->copy_many(src, dst);
  for (int i = 0; i < 5; ++i)
    expect_exact("copy_many_" + std::to_string(i) + "_" + B.mode(), "7x" + std::to_string(cols[i]),
                 testing::download(*B.gpu, dst[i]), want[i]);
  std::vector<Tensor> aligned_src(src.begin(), src.begin() + 4), aligned_dst(dst.begin(), dst.begin() + 4);
  for (auto& t : aligned_dst) B.gpu->zero(t);
  B.gpu->copy_many(aligned_src, aligned_dst);  // all words: the one-launch kernel
  for (int i = 0; i < 4; ++i)
    expect_exact("copy_many_words_" + std::to_string(i) + "_" + B.mode(), "7x" + std::to_string(cols[i]),
                 testing::download(*B.gpu, aligned_dst[i]), want[i]);
}

TEST_P(BackendOps, KdaOpsOnAMixedBatch) {
  kda_ops_on_a_mixed_batch(b(), 32);
  kda_ops_on_a_mixed_batch(b(), 48);
  kda_ops_on_a_mixed_batch(b(), 64);
}

// The chunked recurrence at K3's head width (128) over prompts that cross the kernels' pass
// (4,096 tokens in chunked_mma.cu, 1,024 in chunked.cu) and end in a partial chunk, from a
// non-zero state, with strong decay (g in [-5, 0], as the bounded gate gives) and with weak
// decay (g in [-0.05, 0]: S keeps most of what it saw, so rounding has 4,200 tokens to
// accumulate). In bf16 mode this is the tensor-core kernel (chunked_mma.cu); in fp32 mode the
// CUDA-core one.
TEST_P(BackendOps, KdaChunkedAtK3HeadWidth) {
  Backends& B = b();
  const int H = 3, d = 128, D = H * d;
  KdaShape shape;
  shape.num_heads = H;
  shape.head_dim = d;
  shape.conv_kernel = 4;
  const int64_t slot_floats = kda_state_floats(shape);
  for (const int T : {4200, 130}) {
    for (const float g_lo : {-5.0f, -0.05f}) {
      ForwardBatch fb;
      const std::vector<int32_t> ids(T, 1);
      fb.add_seq(ids.data(), T, 0, 1, nullptr, 0);
      const BatchView vc = B.cpu.upload_batch(fb), vg = B.gpu->upload_batch(fb);
      Pair q = put(B, unit_rows(normal(T * D, 60), d, 1.0f / std::sqrt(float(d))), T, D);
      Pair k = put(B, unit_rows(normal(T * D, 61), d, 1.0f), T, D);
      Pair v = put(B, normal(T * D, 62), T, D);
      Pair g = put(B, optest::random_uniform(T * D, 63, g_lo, 0.0f), T, D);
      Pair beta = put(B, optest::random_uniform(T * H, 64, 0.0f, 1.0f), T, H);
      Pair st = put(B, normal(2 * slot_floats, 65, 0.3f), 2, slot_floats);
      Pair o = out(B, T, D);
      const int64_t s_off = kda_s_offset(shape);
      B.cpu.kda_recurrence(q.c, k.c, v.c, g.c, beta.c, vc, StateLayer{st.c.as<float>() + s_off, slot_floats}, H, d,
                           KdaMode::kChunked, o.c);
      B.gpu->kda_recurrence(q.g, k.g, v.g, g.g, beta.g, vg, StateLayer{st.g.as<float>() + s_off, slot_floats}, H, d,
                            KdaMode::kChunked, o.g);
      const std::string shp = std::to_string(T) + "x" + std::to_string(H) + "x128_g" + (g_lo < -1 ? "strong" : "weak");
      expect_close(std::string("kda_chunked_") + B.mode(), shp, err(B, o), B.tol(kKdaChunkedBf16Tol));
      expect_close(std::string("kda_chunked_state_") + B.mode(), shp, err(B, st), B.tol(kKdaChunkedBf16Tol));
    }
  }
}

TEST_P(BackendOps, MlaOpsOnAMixedBatch) {
  Backends& B = b();
  MixedBatch mb;
  const int T = mb.n_tokens();
  // The first shape takes the CUDA-core kernels; the second (16 heads, nope + rope and v
  // multiples of 16) the grouped CUDA-core decode kernel and, in bf16, the tensor-core
  // prefill; the third (kv_lora 128) the tensor-core grouped decode in bf16 and with an fp8
  // cache. Each runs over a cache of the compute dtype and over an fp8 (e4m3) one, which
  // both backends hold as the same codes (the GPU's hardware conversion against the CPU's
  // f32_to_f8e4m3 in mla_store).
  // The fourth is K3's per-head shape (kv_lora 512, nope 128, rope 64, v 128) over 16 heads.
  // In bf16 every shape's query absorption and output expansion take the 16-byte-load
  // kernels (kv_lora / 8 divides the block).
  // MlaShape: heads, kv_lora, nope, rope, v.
  for (const MlaShape shp : {MlaShape{4, 32, 16, 8, 24}, MlaShape{16, 32, 24, 8, 32}, MlaShape{16, 128, 24, 16, 32},
                             MlaShape{16, 512, 128, 64, 128}}) {
    const int row = shp.row_width(), P = MixedBatch::kPages * MixedBatch::kPageSize;
    const BatchView vc = B.cpu.upload_batch(mb.fb), vg = B.gpu->upload_batch(mb.fb);
    // A pool already holding rows of the past positions.
    const std::vector<float> pool = normal(static_cast<size_t>(P) * row, 50);
    Pair ckv = put(B, normal(T * row, 51, 2.0f), T, row);
    Pair nw = put(B, optest::random_uniform(shp.kv_lora, 52, 0.5f, 1.5f), 1, shp.kv_lora);
    Pair q = put(B, normal(T * shp.num_heads * (shp.nope + shp.rope), 53), T, shp.num_heads * (shp.nope + shp.rope));
    MatrixPair kv_b = put_matrix(B, normal(shp.num_heads * (shp.nope + shp.v_dim) * shp.kv_lora, 54, 0.2f),
                                 shp.num_heads * (shp.nope + shp.v_dim), shp.kv_lora);
    for (const DType kv_dtype : {act(), DType::F8_E4M3}) {
      const bool fp8 = kv_dtype == DType::F8_E4M3;
      const std::string cache_name = fp8 ? "_fp8kv" : "";
      for (MlaMode mode : {MlaMode::kAuto, MlaMode::kPlain, MlaMode::kAbsorbed}) {
        const char* name = mode == MlaMode::kAuto ? "auto" : mode == MlaMode::kPlain ? "plain" : "absorbed";
        Pair cache = put(B, pool, P, row, kv_dtype);
        if (fp8) cache.c = testing::upload(B.cpu, pool, P, row, DType::F8_E4M3);
        const KvLayer kc{cache.c.data, fp8 ? DType::F8_E4M3 : DType::F32, MixedBatch::kPageSize, row};
        const KvLayer kg{cache.g.data, kv_dtype, MixedBatch::kPageSize, row};
        B.cpu.mla_store(ckv.c, nw.c, 1e-6f, vc, kc);
        B.gpu->mla_store(ckv.g, nw.g, 1e-6f, vg, kg);
        // fp8: the same norm in fp32 on both sides, so the codes agree but for a value that
        // lands within fp32 rounding of a tie between two codes.
        expect_close(std::string("mla_store_") + name + cache_name + "_" + B.mode(), "76rows", err(B, cache),
                     fp8 ? 2e-3 : B.tol(4e-3));
        Pair o = out(B, T, shp.num_heads * shp.v_dim);
        B.cpu.mla_attention(q.c, kv_b.c, vc, kc, shp, mode, o.c);
        B.gpu->mla_attention(q.g, kv_b.g, vg, kg, shp, mode, o.g);
        expect_close(std::string("mla_attention_") + name + cache_name + "_" + B.mode(),
                     "3seqs_" + std::to_string(shp.num_heads) + "heads", err(B, o), B.tol(2e-2));
      }
    }
  }
}

// K3.1's DSA ops (issue 38) on the mixed batch (70 new tokens from position 0, one decode
// token after 37, five after 12; pages out of order): the indexer-key store, the index
// scores, the top-k (on the CPU's scores, so both select from the same values; once more
// over scores on a coarse grid, where equal scores must keep the lower position) and MLA
// over the selection. Indexer shapes: a tiny one and K3.1-Pro's 32 heads x 128.
// The FP8 indexer-key pool (backend/dsa_index_row.h): CUDA's store quantises as the CPU does
// (the same scale and codes, a code one step apart at most where the LayerNorm rounds the
// other way), and its scores over identical FP8 rows equal the CPU's to fp32 rounding.
TEST_P(BackendOps, DsaFp8IndexKeysMatchTheCpu) {
  Backends& B = b();
  MixedBatch mb;
  const int T = mb.n_tokens(), P = MixedBatch::kPages * MixedBatch::kPageSize, C = 70;
  const BatchView vc = B.cpu.upload_batch(mb.fb), vg = B.gpu->upload_batch(mb.fb);
  const DsaIndexerShape ish{32, 128};
  const int H = ish.num_heads, D = ish.head_dim, W = dsa_fp8_row_width(D);
  std::vector<uint8_t> bytes(static_cast<size_t>(P) * W);
  const std::vector<float> past = normal(static_cast<size_t>(P) * D, 70);
  for (int r = 0; r < P; ++r) dsa_quantize_index_row(past.data() + static_cast<size_t>(r) * D, D, bytes.data() + size_t(r) * W);
  auto pool_pair = [&] {
    Pair p{B.cpu.alloc(P, W, DType::F8_E4M3, "keys"), B.gpu->alloc(P, W, DType::F8_E4M3, "keys")};
    B.cpu.upload(p.c, 0, bytes.data(), bytes.size());
    B.gpu->upload(p.g, 0, bytes.data(), bytes.size());
    return p;
  };
  auto kv = [&](const Tensor& t) { return KvLayer{t.data, DType::F8_E4M3, MixedBatch::kPageSize, W}; };
  auto dequantised = [&](const std::vector<uint8_t>& raw) {
    std::vector<float> v(static_cast<size_t>(P) * D);
    for (int r = 0; r < P; ++r) dsa_dequantize_index_row(raw.data() + size_t(r) * W, D, v.data() + size_t(r) * D);
    return v;
  };
  auto raw_of = [&](Ops& ops, const Tensor& t) {
    std::vector<uint8_t> raw(static_cast<size_t>(P) * W);
    ops.download(t, raw.data());
    return raw;
  };
  // Scores over identical rows.
  {
    Pair pool = pool_pair();
    Pair q = put(B, normal(T * H * D, 71), T, H * D), w = put(B, normal(T * H, 72), T, H);
    Pair sc = out(B, T, C);
    B.cpu.dsa_index_scores(q.c, w.c, vc, kv(pool.c), ish, sc.c);
    B.gpu->dsa_index_scores(q.g, w.g, vg, kv(pool.g), ish, sc.g);
    std::vector<float> got = testing::download(*B.gpu, sc.g), want = testing::download(B.cpu, sc.c);
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(std::isinf(got[i]), std::isinf(want[i])) << i;
      if (std::isinf(got[i]) || std::isinf(want[i])) got[i] = want[i] = 0;
    }
    expect_close(std::string("dsa_index_scores_fp8_") + B.mode(), "32x128", optest::normalised_error(got, want), 1e-5);
  }
  // The store.
  {
    Pair pool = pool_pair();
    Pair k = put(B, normal(T * D, 73, 2.0f), T, D);
    Pair nw = put(B, optest::random_uniform(D, 74, 0.7f, 1.3f), 1, D), nb = put(B, normal(D, 75, 0.1f), 1, D);
    B.cpu.dsa_index_store(k.c, nw.c, nb.c, 1e-6f, vc, kv(pool.c));
    B.gpu->dsa_index_store(k.g, nw.g, nb.g, 1e-6f, vg, kv(pool.g));
    const std::vector<uint8_t> got = raw_of(*B.gpu, pool.g), want = raw_of(B.cpu, pool.c);
    size_t scales_differ = 0, codes_differ = 0;
    for (int r = 0; r < P; ++r) {
      scales_differ += std::memcmp(got.data() + size_t(r) * W + D, want.data() + size_t(r) * W + D, 4) != 0;
      for (int i = 0; i < D; ++i) codes_differ += got[size_t(r) * W + i] != want[size_t(r) * W + i];
    }
    std::printf("OPERR dsa_index_store_fp8_%s 32x128 scales_differ=%zu codes_differ=%zu of %d\n", B.mode(),
                scales_differ, codes_differ, T * D);
    EXPECT_EQ(scales_differ, 0u);
    EXPECT_LE(codes_differ, static_cast<size_t>(T * D / 100));
    // A code that differs is the neighbouring one: within one e4m3 step (2^-3 of the value).
    expect_close(std::string("dsa_index_store_fp8_") + B.mode(), "32x128",
                 optest::normalised_error(dequantised(got), dequantised(want)), 0.07);
  }
}

TEST_P(BackendOps, DsaOpsOnAMixedBatch) {
  Backends& B = b();
  MixedBatch mb;
  const int T = mb.n_tokens(), P = MixedBatch::kPages * MixedBatch::kPageSize, C = 70, K = 16;
  const BatchView vc = B.cpu.upload_batch(mb.fb), vg = B.gpu->upload_batch(mb.fb);
  for (const DsaIndexerShape ish : {DsaIndexerShape{4, 32}, DsaIndexerShape{32, 128}}) {
    const int H = ish.num_heads, D = ish.head_dim;
    const std::string tag = std::to_string(H) + "x" + std::to_string(D);
    // The key pool: F32 on both backends, past positions already written.
    Pair pool = put(B, normal(static_cast<size_t>(P) * D, 60), P, D);
    const KvLayer kc{pool.c.data, DType::F32, MixedBatch::kPageSize, D};
    const KvLayer kg{pool.g.data, DType::F32, MixedBatch::kPageSize, D};
    Pair k = put(B, normal(T * D, 61, 2.0f), T, D);
    Pair nw = put(B, optest::random_uniform(D, 62, 0.7f, 1.3f), 1, D);
    Pair nb = put(B, normal(D, 63, 0.1f), 1, D);
    B.cpu.dsa_index_store(k.c, nw.c, nb.c, 1e-6f, vc, kc);
    B.gpu->dsa_index_store(k.g, nw.g, nb.g, 1e-6f, vg, kg);
    expect_close(std::string("dsa_index_store_") + B.mode(), tag, err(B, pool), 2e-6);

    Pair q = put(B, normal(T * H * D, 64), T, H * D);
    Pair w = put(B, normal(T * H, 65), T, H);
    Pair sc = out(B, T, C);
    B.cpu.dsa_index_scores(q.c, w.c, vc, kc, ish, sc.c);
    B.gpu->dsa_index_scores(q.g, w.g, vg, kg, ish, sc.g);
    {
      // -inf past each token's position on both; the finite scores to fp32 rounding.
      std::vector<float> got = testing::download(*B.gpu, sc.g), want = testing::download(B.cpu, sc.c);
      size_t masks_differ = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        masks_differ += std::isinf(got[i]) != std::isinf(want[i]);
        if (std::isinf(got[i])) got[i] = 0;
        if (std::isinf(want[i])) want[i] = 0;
      }
      EXPECT_EQ(masks_differ, 0u) << tag;
      expect_close(std::string("dsa_index_scores_") + B.mode(), tag, optest::normalised_error(got, want), 1e-5);
    }

    // The top-k of the same scores on both, then of scores with many ties.
    const std::vector<float> cpu_scores = testing::download(B.cpu, sc.c);
    std::vector<float> coarse = cpu_scores;
    for (float& v : coarse)
      if (!std::isinf(v)) v = std::floor(v * 0.5f);
    for (const auto& [name, values] : {std::pair{std::string("random"), cpu_scores}, std::pair{std::string("ties"), coarse}}) {
      Pair s2 = put(B, values, T, C);
      Pair sel = out(B, T, K, DType::I32);
      B.cpu.dsa_topk(s2.c, vc, sel.c);
      B.gpu->dsa_topk(s2.g, vg, sel.g);
      expect_exact(std::string("dsa_topk_") + B.mode(), name + "_" + tag, testing::download(*B.gpu, sel.g),
                   testing::download(B.cpu, sel.c));
    }

    // A block of the batch's rows (model/layers/dsa.h scores a block of tokens at a time):
    // rows 30 to the end (the prefill's tail, the decode token, the five after 12) scored and
    // selected on their own equal the whole batch's rows, on both backends.
    {
      const int first = 30, rows = T - first;
      std::vector<float> q_host = testing::download(B.cpu, q.c), w_host = testing::download(B.cpu, w.c);
      Pair qb = put(B, std::vector<float>(q_host.begin() + first * H * D, q_host.end()), rows, H * D);
      Pair wb = put(B, std::vector<float>(w_host.begin() + first * H, w_host.end()), rows, H);
      Pair sb = out(B, rows, C);
      B.cpu.dsa_index_scores(qb.c, wb.c, vc, kc, ish, sb.c, first);
      B.gpu->dsa_index_scores(qb.g, wb.g, vg, kg, ish, sb.g, first);
      std::vector<float> whole = testing::download(B.cpu, sc.c), cpu_block = testing::download(B.cpu, sb.c),
                         gpu_block = testing::download(*B.gpu, sb.g);
      EXPECT_EQ(cpu_block, std::vector<float>(whole.begin() + static_cast<int64_t>(first) * C, whole.end())) << tag;
      for (size_t i = 0; i < gpu_block.size(); ++i) {
        if (std::isinf(gpu_block[i]) || std::isinf(cpu_block[i])) {
          EXPECT_EQ(std::isinf(gpu_block[i]), std::isinf(cpu_block[i])) << tag << " block score " << i;
          gpu_block[i] = cpu_block[i] = 0;
        }
      }
      expect_close(std::string("dsa_index_scores_block_") + B.mode(), tag,
                   optest::normalised_error(gpu_block, cpu_block), 1e-5);
      Pair selb = out(B, rows, K, DType::I32), sel_whole = out(B, T, K, DType::I32);
      Pair sb_cpu = put(B, cpu_block, rows, C);  // both select from the same scores
      B.cpu.dsa_topk(sb_cpu.c, vc, selb.c, first);
      B.gpu->dsa_topk(sb_cpu.g, vg, selb.g, first);
      B.cpu.dsa_topk(sc.c, vc, sel_whole.c);
      const std::vector<float> all_rows = testing::download(B.cpu, sel_whole.c);
      expect_exact(std::string("dsa_topk_block_") + B.mode(), tag, testing::download(*B.gpu, selb.g),
                   std::vector<float>(all_rows.begin() + static_cast<int64_t>(first) * K, all_rows.end()));
    }

    // MLA over the CPU's selection, on both.
    const MlaShape shp{H <= 4 ? 4 : 16, 512, 128, 64, 128};
    const int row = shp.row_width();
    Pair sel = out(B, T, K, DType::I32);
    B.cpu.dsa_topk(sc.c, vc, sel.c);
    std::vector<float> sel_f = testing::download(B.cpu, sel.c);
    std::vector<int32_t> sel_i(sel_f.begin(), sel_f.end());
    Pair sel_both = put_i32(B, sel_i, T, K);
    Pair cache = put(B, normal(static_cast<size_t>(P) * row, 66), P, row, act());
    const KvLayer lc{cache.c.data, DType::F32, MixedBatch::kPageSize, row};
    const KvLayer lg{cache.g.data, act(), MixedBatch::kPageSize, row};
    Pair mq = put(B, normal(T * shp.num_heads * (shp.nope + shp.rope), 67), T, shp.num_heads * (shp.nope + shp.rope));
    MatrixPair kv_b = put_matrix(B, normal(shp.num_heads * (shp.nope + shp.v_dim) * shp.kv_lora, 68, 0.2f),
                                 shp.num_heads * (shp.nope + shp.v_dim), shp.kv_lora);
    Pair o = out(B, T, shp.num_heads * shp.v_dim);
    B.cpu.mla_sparse_attention(mq.c, kv_b.c, vc, lc, shp, MlaMode::kAuto, sel_both.c, o.c);
    B.gpu->mla_sparse_attention(mq.g, kv_b.g, vg, lg, shp, MlaMode::kAuto, sel_both.g, o.g);
    expect_close(std::string("mla_sparse_attention_") + B.mode(), "top16_" + std::to_string(shp.num_heads) + "heads",
                 err(B, o), B.tol(2e-2));
  }
}

// DSA at K3.1-Pro's widths, through the fast kernels (MOONRUN_DSA_FAST / cuda::set_dsa_fast)
// and the reference ones: the top 2,048 of rows of up to 20,001 scores (several radix bins
// and write tiles; random scores and coarse ones with many ties, where the lowest positions
// must win), exact against the CPU; then MLA over that selection with 96 heads on bf16 rows
// (the whole-token warpgroup-MMA decode kernel, two blocks of 48 heads) and fp8 rows (six
// 16-head groups on mma.sync), the selection split over the SMs, per token against the CPU. Decode tokens after 20,000 / 5,000 / 2,047 / 1,999 positions (more,
// exactly and fewer than 2,048 visible) and an 8-token chunk after 3,000.
TEST_P(BackendOps, DsaAtK31Widths) {
  Backends& B = b();
  const int page = 16, K = 2048;
  struct Seq {
    int n_past, n_new;
  };
  const std::vector<Seq> seqs = {{20000, 1}, {5000, 1}, {2047, 1}, {1999, 1}, {3000, 8}};
  int n_pages = 0;
  for (const Seq& s : seqs) n_pages += (s.n_past + s.n_new + page - 1) / page;
  std::vector<int32_t> all_pages(n_pages);
  for (int i = 0; i < n_pages; ++i) all_pages[i] = (i * 613) % n_pages;  // a permutation (613 is prime)
  ForwardBatch fb;
  const std::vector<int32_t> ids(8, 1);
  int used = 0, cols = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const int np = (seqs[i].n_past + seqs[i].n_new + page - 1) / page;
    fb.add_seq(ids.data(), seqs[i].n_new, seqs[i].n_past, static_cast<int>(i), all_pages.data() + used, np);
    used += np;
    cols = std::max(cols, seqs[i].n_past + seqs[i].n_new);
  }
  const int T = fb.n_tokens(), P = n_pages * page;
  const BatchView vc = B.cpu.upload_batch(fb), vg = B.gpu->upload_batch(fb);
  const bool was = cuda::dsa_fast();

  std::vector<float> random = normal(static_cast<size_t>(T) * cols, 90), coarse = random;
  for (float& v : coarse) v = std::floor(v * 2.0f);  // ~10 distinct values: ties across every tile
  std::vector<float> cpu_selection;
  for (const bool fast : {true, false}) {
    cuda::set_dsa_fast(fast);
    for (const auto& [name, values] : {std::pair{std::string("random"), random}, std::pair{std::string("ties"), coarse}}) {
      Pair sc = put(B, values, T, cols);
      Pair sel = out(B, T, K, DType::I32);
      B.cpu.dsa_topk(sc.c, vc, sel.c);
      B.gpu->dsa_topk(sc.g, vg, sel.g);
      const std::vector<float> want = testing::download(B.cpu, sel.c);
      expect_exact(std::string(fast ? "dsa_topk_fast_" : "dsa_topk_") + B.mode(), name + "_2048of20001",
                   testing::download(*B.gpu, sel.g), want);
      if (name == "random") cpu_selection = want;
    }
  }

  // Long rows for few tokens: the fast top-k cuts them into slices (each keeps its own top
  // 2,048), then selects from the slices' union (300,001 scores: 9 slices; 70,001: 2).
  {
    const std::vector<int> long_past = {300000, 70000, 3000};
    ForwardBatch lb;
    size_t total_pages = 0;
    for (const int p : long_past) total_pages += (p + page) / page;  // p + 1 positions a sequence
    std::vector<int32_t> lpages(total_pages);
    for (size_t i = 0; i < lpages.size(); ++i) lpages[i] = static_cast<int32_t>(i);
    int at = 0;
    for (size_t i = 0; i < long_past.size(); ++i) {
      const int np = (long_past[i] + page) / page;
      lb.add_seq(ids.data(), 1, long_past[i], static_cast<int>(i), lpages.data() + at, np);
      at += np;
    }
    const int LT = lb.n_tokens(), lcols = long_past[0] + 1;
    const BatchView lc = B.cpu.upload_batch(lb), lg = B.gpu->upload_batch(lb);
    std::vector<float> lrandom = normal(static_cast<size_t>(LT) * lcols, 97), lcoarse = lrandom;
    for (float& v : lcoarse) v = std::floor(v * 2.0f);
    for (const bool fast : {true, false}) {
      cuda::set_dsa_fast(fast);
      for (const auto& [name, values] : {std::pair{std::string("random"), lrandom}, std::pair{std::string("ties"), lcoarse}}) {
        Pair sc = put(B, values, LT, lcols);
        Pair sel = out(B, LT, K, DType::I32);
        B.cpu.dsa_topk(sc.c, lc, sel.c);
        B.gpu->dsa_topk(sc.g, lg, sel.g);
        expect_exact(std::string(fast ? "dsa_topk_fast_" : "dsa_topk_") + B.mode(), name + "_2048of300001",
                     testing::download(*B.gpu, sel.g), testing::download(B.cpu, sel.c));
      }
    }
  }

  // The indexer's scores over an FP8 key pool at K3.1's 32 heads x 128: the tensor-core
  // kernel (bf16 math only: the query rounded to bf16) within 1e-2 of the CPU's fp32 scores,
  // the same positions masked; the reference kernel (and every kernel under --dtype float32)
  // to fp32 rounding.
  {
    const DsaIndexerShape ish{32, 128};
    const int H = ish.num_heads, D = ish.head_dim, W = dsa_fp8_row_width(D);
    std::vector<uint8_t> bytes(static_cast<size_t>(P) * W);
    const std::vector<float> keys = normal(static_cast<size_t>(P) * D, 94);
    for (int r = 0; r < P; ++r) dsa_quantize_index_row(keys.data() + static_cast<size_t>(r) * D, D, bytes.data() + size_t(r) * W);
    Pair pool{B.cpu.alloc(P, W, DType::F8_E4M3, "keys"), B.gpu->alloc(P, W, DType::F8_E4M3, "keys")};
    B.cpu.upload(pool.c, 0, bytes.data(), bytes.size());
    B.gpu->upload(pool.g, 0, bytes.data(), bytes.size());
    const KvLayer kc{pool.c.data, DType::F8_E4M3, page, W}, kg{pool.g.data, DType::F8_E4M3, page, W};
    Pair q = put(B, normal(static_cast<size_t>(T) * H * D, 95), T, H * D), w = put(B, normal(static_cast<size_t>(T) * H, 96), T, H);
    Pair want_sc = out(B, T, cols);
    B.cpu.dsa_index_scores(q.c, w.c, vc, kc, ish, want_sc.c);
    const std::vector<float> want = testing::download(B.cpu, want_sc.c);
    for (const bool fast : {true, false}) {
      cuda::set_dsa_fast(fast);
      Pair sc = out(B, T, cols);
      B.gpu->dsa_index_scores(q.g, w.g, vg, kg, ish, sc.g);
      std::vector<float> got = testing::download(*B.gpu, sc.g), ref = want;
      size_t masks_differ = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        masks_differ += std::isinf(got[i]) != std::isinf(ref[i]);
        if (std::isinf(got[i]) || std::isinf(ref[i])) got[i] = ref[i] = 0;
      }
      EXPECT_EQ(masks_differ, 0u) << (fast ? "fast" : "reference");
      const bool mma = fast && !B.f32;
      expect_close(std::string(fast ? "dsa_index_scores_fast_fp8_" : "dsa_index_scores_fp8_") + B.mode(), "32x128_20001",
                   optest::normalised_error(got, ref), mma ? 1e-2 : 1e-5);
    }
  }

  const MlaShape shp{96, 512, 128, 64, 128};
  const int row = shp.row_width();
  const std::vector<int32_t> sel_i(cpu_selection.begin(), cpu_selection.end());
  Pair sel = put_i32(B, sel_i, T, K);
  const std::vector<float> pool = normal(static_cast<size_t>(P) * row, 91);
  Pair mq = put(B, normal(static_cast<size_t>(T) * shp.num_heads * (shp.nope + shp.rope), 92), T,
                shp.num_heads * (shp.nope + shp.rope));
  MatrixPair kv_b = put_matrix(B, normal(static_cast<size_t>(shp.num_heads) * (shp.nope + shp.v_dim) * shp.kv_lora, 93, 0.2f),
                               shp.num_heads * (shp.nope + shp.v_dim), shp.kv_lora);
  const int64_t o_width = static_cast<int64_t>(shp.num_heads) * shp.v_dim;
  for (const DType kv_dtype : {act(), DType::F8_E4M3}) {
    const bool fp8 = kv_dtype == DType::F8_E4M3;
    Pair cache = put(B, pool, P, row, kv_dtype);
    if (fp8) cache.c = testing::upload(B.cpu, pool, P, row, DType::F8_E4M3);
    const KvLayer kc{cache.c.data, fp8 ? DType::F8_E4M3 : DType::F32, page, row};
    const KvLayer kg{cache.g.data, kv_dtype, page, row};
    Pair o_cpu = out(B, T, o_width);
    B.cpu.mla_sparse_attention(mq.c, kv_b.c, vc, kc, shp, MlaMode::kAuto, sel.c, o_cpu.c);
    const std::vector<float> want = testing::download(B.cpu, o_cpu.c);
    for (const bool fast : {true, false}) {
      cuda::set_dsa_fast(fast);
      Pair o = out(B, T, o_width);
      B.gpu->mla_sparse_attention(mq.g, kv_b.g, vg, kg, shp, MlaMode::kAuto, sel.g, o.g);
      const std::vector<float> got = testing::download(*B.gpu, o.g);
      for (int t = 0; t < T; ++t) {
        const std::vector<float> g(got.begin() + t * o_width, got.begin() + (t + 1) * o_width);
        const std::vector<float> w(want.begin() + t * o_width, want.begin() + (t + 1) * o_width);
        expect_close(std::string(fast ? "mla_sparse_attention_fast_" : "mla_sparse_attention_") + (fp8 ? "fp8kv_" : "") +
                         B.mode(),
                     "96heads_top2048_token" + std::to_string(t), optest::normalised_error(g, w), B.tol(2e-2));
      }
    }
  }
  cuda::set_dsa_fast(was);
}

// A chunk over a long cached prefix: plain-mode MLA walks the prefix in blocks of keys
// (ops.h: mla_prefill_key_block), so a chunk after 9,000 cached positions takes two prefix
// blocks (8,192 + 808 keys) and then its own keys, merged by log-sum-exp; in bf16 at K3's
// head dims every block runs on the warpgroup-MMA kernel (mla_flash_prefill.cu). Beside it a
// chunk of 257 tokens (a partial 128-row tile) after 130 positions, and a decode token. Each
// sequence's rows are held to the tolerance on their own, so one wrong block cannot hide in
// the others' error.
TEST_P(BackendOps, MlaPrefillOverALongPrefix) {
  Backends& B = b();
  const MlaShape shp{8, 512, 128, 64, 128};
  const int page = 16, row = shp.row_width();
  struct Seq {
    int n_past, n_new;
  };
  const std::vector<Seq> seqs = {{9000, 700}, {130, 257}, {500, 1}};
  // Every sequence's pages, shuffled over one pool.
  int n_pages = 0;
  for (const Seq& s : seqs) n_pages += (s.n_past + s.n_new + page - 1) / page;
  std::vector<int32_t> all_pages(n_pages);
  for (int i = 0; i < n_pages; ++i) all_pages[i] = (i * 7919) % n_pages;  // a permutation (7919 is prime)
  ForwardBatch fb;
  std::vector<int32_t> ids(1000, 1);
  int used = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const int np = (seqs[i].n_past + seqs[i].n_new + page - 1) / page;
    fb.add_seq(ids.data(), seqs[i].n_new, seqs[i].n_past, static_cast<int>(i), all_pages.data() + used, np);
    used += np;
  }
  const int T = fb.n_tokens(), P = n_pages * page;
  const BatchView vc = B.cpu.upload_batch(fb), vg = B.gpu->upload_batch(fb);
  const std::vector<float> pool = normal(static_cast<size_t>(P) * row, 70);
  Pair ckv = put(B, normal(static_cast<size_t>(T) * row, 71, 2.0f), T, row);
  Pair nw = put(B, optest::random_uniform(shp.kv_lora, 72, 0.5f, 1.5f), 1, shp.kv_lora);
  Pair q = put(B, normal(static_cast<size_t>(T) * shp.num_heads * (shp.nope + shp.rope), 73), T,
               shp.num_heads * (shp.nope + shp.rope));
  MatrixPair kv_b = put_matrix(B, normal(shp.num_heads * (shp.nope + shp.v_dim) * shp.kv_lora, 74, 0.2f),
                               shp.num_heads * (shp.nope + shp.v_dim), shp.kv_lora);
  const int64_t o_width = static_cast<int64_t>(shp.num_heads) * shp.v_dim;
  for (const DType kv_dtype : {act(), DType::F8_E4M3}) {
    const bool fp8 = kv_dtype == DType::F8_E4M3;
    for (MlaMode mode : {MlaMode::kAuto, MlaMode::kPlain}) {
      Pair cache = put(B, pool, P, row, kv_dtype);
      if (fp8) cache.c = testing::upload(B.cpu, pool, P, row, DType::F8_E4M3);
      const KvLayer kc{cache.c.data, fp8 ? DType::F8_E4M3 : DType::F32, page, row};
      const KvLayer kg{cache.g.data, kv_dtype, page, row};
      B.cpu.mla_store(ckv.c, nw.c, 1e-6f, vc, kc);
      B.gpu->mla_store(ckv.g, nw.g, 1e-6f, vg, kg);
      Pair o = out(B, T, o_width);
      B.cpu.mla_attention(q.c, kv_b.c, vc, kc, shp, mode, o.c);
      B.gpu->mla_attention(q.g, kv_b.g, vg, kg, shp, mode, o.g);
      const std::vector<float> got = testing::download(*B.gpu, o.g), want = testing::download(B.cpu, o.c);
      for (size_t i = 0; i < seqs.size(); ++i) {
        const int64_t first = fb.seqs[i].token_start * o_width, n = seqs[i].n_new * o_width;
        const std::vector<float> g(got.begin() + first, got.begin() + first + n);
        const std::vector<float> w(want.begin() + first, want.begin() + first + n);
        // fp32: each output sums up to 9,700 weighted rows, in blocks merged by log-sum-exp
        // on the GPU and in one pass on the CPU; 3.1e-5 was measured (H200), so 1e-4.
        const double f32_tol = seqs[i].n_past > 8192 ? 1e-4 : 2e-5;
        expect_close(std::string("mla_long_prefix_") + (mode == MlaMode::kAuto ? "auto" : "plain") +
                         (fp8 ? "_fp8kv_" : "_") + B.mode(),
                     std::to_string(seqs[i].n_past) + "+" + std::to_string(seqs[i].n_new) + "_8heads",
                     optest::normalised_error(g, w), B.f32 ? f32_tol : 2e-2);
      }
    }
  }
}

// Decode at K3's cache row over head counts of the tensor-parallel splits (96 at one GPU: two
// blocks of 48; 40: one block of 48 with 8 empty heads; 6, as at TP 16: one 16-head tile),
// one token a sequence over 5,000 / 37 / 2,000 / 40,000 cached positions, so the context splits over
// many blocks (mla_decode_heads.cu) and some splits are empty. Per token, as above.
void mla_decode_over_many_heads(Backends& B, const std::string& name) {
  const int page = 16;
  // 40,000 (bf16 only): ~19 rounds a split, so the tensor-core kernels reuse both row
  // buffers. The fp32 path (--dtype float32, one block a head) sums 40,000 terms in another
  // order than the CPU: ~1e-4 normalised, past the fp32 bound these cases are held to.
  std::vector<int> past = {5000, 37, 2000};
  if (!B.f32) past.push_back(40000);
  for (const int heads : {96, 40, 6}) {
    const MlaShape shp{heads, 512, 128, 64, 128};
    const int row = shp.row_width();
    int n_pages = 0;
    for (int p : past) n_pages += (p + 1 + page - 1) / page;
    std::vector<int32_t> all_pages(n_pages);
    for (int i = 0; i < n_pages; ++i) all_pages[i] = (i * 613) % n_pages;  // 613 is prime
    ForwardBatch fb;
    const int32_t id = 1;
    int used = 0;
    for (size_t i = 0; i < past.size(); ++i) {
      const int np = (past[i] + 1 + page - 1) / page;
      fb.add_seq(&id, 1, past[i], static_cast<int>(i), all_pages.data() + used, np);
      used += np;
    }
    const int T = fb.n_tokens(), P = n_pages * page;
    const BatchView vc = B.cpu.upload_batch(fb), vg = B.gpu->upload_batch(fb);
    Pair ckv = put(B, normal(static_cast<size_t>(T) * row, 81, 2.0f), T, row);
    Pair nw = put(B, optest::random_uniform(shp.kv_lora, 82, 0.5f, 1.5f), 1, shp.kv_lora);
    Pair q = put(B, normal(static_cast<size_t>(T) * heads * (shp.nope + shp.rope), 83), T, heads * (shp.nope + shp.rope));
    MatrixPair kv_b = put_matrix(B, normal(static_cast<size_t>(heads) * (shp.nope + shp.v_dim) * shp.kv_lora, 84, 0.2f),
                                 heads * (shp.nope + shp.v_dim), shp.kv_lora);
    Pair cache = put(B, normal(static_cast<size_t>(P) * row, 80), P, row, B.gpu->act_dtype());
    const KvLayer kc{cache.c.data, DType::F32, page, row}, kg{cache.g.data, B.gpu->act_dtype(), page, row};
    B.cpu.mla_store(ckv.c, nw.c, 1e-6f, vc, kc);
    B.gpu->mla_store(ckv.g, nw.g, 1e-6f, vg, kg);
    const int64_t o_width = static_cast<int64_t>(heads) * shp.v_dim;
    Pair o = out(B, T, o_width);
    B.cpu.mla_attention(q.c, kv_b.c, vc, kc, shp, MlaMode::kAuto, o.c);
    B.gpu->mla_attention(q.g, kv_b.g, vg, kg, shp, MlaMode::kAuto, o.g);
    const std::vector<float> got = testing::download(*B.gpu, o.g), want = testing::download(B.cpu, o.c);
    for (int i = 0; i < T; ++i) {
      const std::vector<float> g(got.begin() + i * o_width, got.begin() + (i + 1) * o_width);
      const std::vector<float> w(want.begin() + i * o_width, want.begin() + (i + 1) * o_width);
      expect_close(name + "_" + B.mode(), std::to_string(heads) + "heads_past" + std::to_string(past[i]),
                   optest::normalised_error(g, w), B.tol(2e-2));
    }
  }
}

TEST_P(BackendOps, MlaDecodeOverManyHeads) { mla_decode_over_many_heads(b(), "mla_decode_heads"); }

// The same cases through the warp-specialised kernel (TMA producer, consumers split by heads;
// MOONRUN_MLA_DECODE_TMA), where it applies (bf16 rows on sm_90a).
TEST_P(BackendOps, MlaDecodeOverManyHeadsTma) {
  const bool was = cuda::mla_decode_tma();
  cuda::set_mla_decode_tma(true);
  mla_decode_over_many_heads(b(), "mla_decode_heads_tma");
  cuda::set_mla_decode_tma(was);
}

// ---- MoE --------------------------------------------------------------------------------

// Sets an environment variable for a scope, restoring what was there.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_) ::setenv(name_, old_.c_str(), 1);
    else ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

TEST_P(BackendOps, RouterAndExperts) {
  Backends& B = b();
  const int T = 21, E = 16, K = 4, Dm = 64, I = 96;
  // router: grouped and plain, ids exact
  for (const RouterParams& p : {RouterParams{E, K, 4, 2, true, 2.5f}, RouterParams{E, K, 1, 1, false, 1.0f}}) {
    Pair logits = put(B, normal(T * E, 60, 2.0f), T, E), bias = put(B, normal(E, 61, 0.5f), 1, E);
    Pair ids = out(B, T, K, DType::I32), w = out(B, T, K);
    B.cpu.router_topk(logits.c, bias.c, p, ids.c, w.c);
    B.gpu->router_topk(logits.g, bias.g, p, ids.g, w.g);
    expect_exact(std::string("router_ids_") + B.mode(), p.num_expert_group > 1 ? "grouped" : "plain",
                 testing::download(*B.gpu, ids.g), testing::download(B.cpu, ids.c));
    expect_close(std::string("router_weights_") + B.mode(), "21x16", err(B, w), 1e-6);
  }
  // K3's router (896 experts, top 16, one group) for one and five tokens, with logits
  // rounded to a coarse grid so that equal biased scores occur and the lower id must win,
  // and grouped over 8 groups keeping 3.
  for (const RouterParams& p : {RouterParams{896, 16, 1, 1, true, 2.5f}, RouterParams{896, 16, 8, 3, true, 2.5f}}) {
    for (const int n : {1, 5}) {
      std::vector<float> lg = normal(static_cast<size_t>(n) * 896, 62 + n, 2.0f);
      for (float& v : lg) v = std::round(v * 4.0f) / 4.0f;
      Pair logits = put(B, lg, n, 896), bias = put(B, std::vector<float>(896, 0.0f), 1, 896);
      Pair ids = out(B, n, 16, DType::I32), w = out(B, n, 16);
      B.cpu.router_topk(logits.c, bias.c, p, ids.c, w.c);
      B.gpu->router_topk(logits.g, bias.g, p, ids.g, w.g);
      const std::string name = std::to_string(n) + "x896" + (p.num_expert_group > 1 ? "_grouped" : "");
      expect_exact(std::string("router_ids_") + B.mode(), name, testing::download(*B.gpu, ids.g),
                   testing::download(B.cpu, ids.c));
      expect_close(std::string("router_weights_") + B.mode(), name, err(B, w), 1e-6);
    }
  }
  // experts: MXFP4 (the same codes on both) and dense. Which MXFP4 kernel: up to 8 tokens
  // with in % 64 and out % 32, the whole-tile decode kernel, whose eight warps read their
  // last 64-wide slice themselves and the rest from the copied tile (6x128x192 and
  // 1x512x768: fewer slices than warps, or as many and nothing copied; 5x1344x192: 21 slices,
  // not a multiple of the warps; 3x1024x1024 and 8x1024x576: both parts, as at K3's widths,
  // and 576 = 1 + 8 slices; and the rest); more tokens, the register-fed tensor-core kernel
  // (21x64x96 for w1 / w3, 150x128x192 with more than one 32-token tile per expert); what
  // neither takes, the CUDA-core kernel (w2 of 21x64x96, in 96). From 512 tokens in bf16 on
  // Hopper, the warpgroup-MMA kernel (600x256x384: ~185 slots an expert, one pass of three
  // n64 tiles; 1100x128x256: ~340, two passes, the second partial). Edge scales: E8M0 0, 1,
  // 127, 128 and 129, 130 past the one-multiply range, in the decode kernel's both parts and
  // the wgmma kernel's two-step path. 4x7168x256: w1 / w3's 7168 inputs (K2's hidden width)
  // are past two tiles' shared memory, so the decode kernel runs with one m16 tile a block
  // (MOONRUN_EXPERT_ONE_TILE=1, set for this test; the gated launch takes 8 rows of each
  // matrix), edge scales included.
  ScopedEnv one_tile("MOONRUN_EXPERT_ONE_TILE", "1");
  // multi_pass: MOONRUN_EXPERT_MULTI_PASS=1 (the default), so steps of 9 .. 256 tokens take the whole-tile
  // kernel too, each block running its expert's slots in passes of 8 over its tile (32 and
  // 128 tokens: ~20 and ~80 slots an expert, 3 to 10 passes; 24 x 7168: one-tile blocks).
  struct Shape {
    int T, Dm, I;
    bool edge_scales = false;
    bool multi_pass = false;
  };
  for (const Shape sh : {Shape{T, Dm, I}, Shape{6, 128, 192}, Shape{150, 128, 192}, Shape{5, 1344, 192},
                         Shape{1, 512, 768}, Shape{7, 768, 512}, Shape{7, 512, 256, true}, Shape{3, 1024, 1024},
                         Shape{8, 1024, 576, true}, Shape{600, 256, 384}, Shape{1100, 128, 256, true},
                         Shape{4, 7168, 256, true}, Shape{32, 1024, 576, false, true},
                         Shape{128, 512, 256, true, true}, Shape{24, 7168, 256, false, true}}) {
    // The others pin it off, so shapes of 9 .. 256 tokens keep testing the mma kernel.
    ScopedEnv multi("MOONRUN_EXPERT_MULTI_PASS", sh.multi_pass ? "1" : "0");
    const int Tn = sh.T, Dn = sh.Dm, In = sh.I;
    std::vector<int32_t> ids;
    for (int t = 0; t < Tn; ++t)
      for (int k = 0; k < K; ++k) ids.push_back((t * 5 + k * 3) % (E - 3));  // not every expert
    Pair id = put_i32(B, ids, Tn, K);
    Pair wt = put(B, optest::random_uniform(Tn * K, 62, 0.0f, 1.0f), Tn, K);
    Pair x = put(B, normal(Tn * Dn, 63), Tn, Dn, act());
    for (bool mxfp4 : {true, false}) {
      auto experts = [&](int out_f, int in_f, uint64_t seed) {
        ExpertMatrices c, g;
        c.num_experts = g.num_experts = E;
        c.stacked.out = g.stacked.out = out_f;
        c.stacked.in = g.stacked.in = in_f;
        if (mxfp4) {
          std::vector<uint8_t> codes(static_cast<size_t>(E) * out_f * in_f / 2), scales(static_cast<size_t>(E) * out_f * in_f / 32);
          testing::Rng r(seed);
          for (auto& v : codes) v = static_cast<uint8_t>(r.bits());
          static constexpr uint8_t kEdge[] = {0, 1, 127, 128, 129, 130};
          for (auto& v : scales)
            v = sh.edge_scales ? kEdge[r.bits() % std::size(kEdge)] : static_cast<uint8_t>(120 + r.bits() % 5);
          for (Ops* ops : {static_cast<Ops*>(&B.cpu), B.gpu.get()}) {
            ExpertMatrices& m = ops == &B.cpu ? c : g;
            m.stacked.w = ops->alloc(static_cast<int64_t>(E) * out_f, in_f / 2, DType::U8, "codes");
            m.stacked.scales = ops->alloc(static_cast<int64_t>(E) * out_f, in_f / 32, DType::U8, "scales");
            ops->upload(m.stacked.w, 0, codes.data(), codes.size());
            ops->upload(m.stacked.scales, 0, scales.data(), scales.size());
            ops->repack_experts(m);  // as the loader does (CUDA: the pair-ready code layout)
          }
        } else {
          Pair w = put(B, normal(static_cast<size_t>(E) * out_f * in_f, seed, 0.1f), static_cast<int64_t>(E) * out_f,
                       in_f, B.gpu->weight_dtype());
          c.stacked.w = w.c;
          g.stacked.w = w.g;
        }
        return std::pair{c, g};
      };
      auto [w1c, w1g] = experts(In, Dn, 70);
      auto [w3c, w3g] = experts(In, Dn, 71);
      auto [w2c, w2g] = experts(Dn, In, 72);
      Pair y = out(B, Tn, Dn);
      // K3's SiTU; SiTU without the linear tanh on u; SwiGLU (Kimi Linear): the decode
      // kernel applies each as it stores the gate and up sums.
      const ActivationParams ap = Tn == 1   ? ActivationParams{true, 4.0f, 0.0f}
                                  : Tn == 7 && Dn == 768 ? ActivationParams{false, 0.0f, 0.0f}
                                                         : ActivationParams{true, 4.0f, 25.0f};
      const std::string act_name = !ap.situ ? "_swiglu" : ap.linear_beta == 0 ? "_situ_nolinear" : "";
      B.cpu.moe_experts(x.c, id.c, wt.c, w1c, w3c, w2c, ap, y.c);
      B.gpu->moe_experts(x.g, id.g, wt.g, w1g, w3g, w2g, ap, y.g);
      expect_close(std::string("moe_experts_") + (mxfp4 ? "mxfp4_" : "dense_") + B.mode(),
                   std::to_string(Tn) + "x" + std::to_string(Dn) + "x" + std::to_string(In) +
                       (sh.edge_scales ? "_edge_scales" : "") + act_name,
                   err(B, y), B.tol(2e-2));
    }
  }

  // Many experts: the grouping scans 32-expert chunks in parallel (200 experts: 7 chunks, the
  // last partial, most experts idle), and places more than 32 slots; an expert-parallel
  // shard (experts 64-163 of the 200) drops the slots that chose another rank's experts.
  for (const int Tn : {3, 40}) {
    const int E2 = 200, K2 = 8, Dn = 64, In = 64;
    for (const auto [first, count] : {std::pair{0, E2}, std::pair{64, 100}}) {
      std::vector<int32_t> ids;
      for (int t = 0; t < Tn; ++t)
        for (int k = 0; k < K2; ++k) ids.push_back((t * 37 + k * 23 + (t * k) % 5) % E2);
      Pair id = put_i32(B, ids, Tn, K2);
      Pair wt = put(B, optest::random_uniform(Tn * K2, 64, 0.0f, 1.0f), Tn, K2);
      Pair x = put(B, normal(Tn * Dn, 65), Tn, Dn, act());
      auto experts = [&](int out_f, int in_f, uint64_t seed) {
        ExpertMatrices c, g;
        std::vector<uint8_t> codes(static_cast<size_t>(count) * out_f * in_f / 2), scales(codes.size() / 16);
        testing::Rng r(seed);
        for (auto& v : codes) v = static_cast<uint8_t>(r.bits());
        for (auto& v : scales) v = static_cast<uint8_t>(120 + r.bits() % 5);
        for (Ops* ops : {static_cast<Ops*>(&B.cpu), B.gpu.get()}) {
          ExpertMatrices& m = ops == &B.cpu ? c : g;
          m.num_experts = count;
          m.first_expert = first;
          m.stacked.out = out_f;
          m.stacked.in = in_f;
          m.stacked.w = ops->alloc(static_cast<int64_t>(count) * out_f, in_f / 2, DType::U8, "codes");
          m.stacked.scales = ops->alloc(static_cast<int64_t>(count) * out_f, in_f / 32, DType::U8, "scales");
          ops->upload(m.stacked.w, 0, codes.data(), codes.size());
          ops->upload(m.stacked.scales, 0, scales.data(), scales.size());
          ops->repack_experts(m);
        }
        return std::pair{c, g};
      };
      auto [w1c, w1g] = experts(In, Dn, 73);
      auto [w3c, w3g] = experts(In, Dn, 74);
      auto [w2c, w2g] = experts(Dn, In, 75);
      Pair y = out(B, Tn, Dn);
      const ActivationParams ap{true, 4.0f, 25.0f};
      B.cpu.moe_experts(x.c, id.c, wt.c, w1c, w3c, w2c, ap, y.c);
      B.gpu->moe_experts(x.g, id.g, wt.g, w1g, w3g, w2g, ap, y.g);
      expect_close(std::string("moe_experts_many_") + B.mode(),
                   std::to_string(Tn) + "x200_experts_" + std::to_string(first) + "+" + std::to_string(count),
                   err(B, y), B.tol(2e-2));
    }
  }
}

// ---- sampling -----------------------------------------------------------------------------

TEST_P(BackendOps, SamplingWithEdits) {
  Backends& B = b();
  const int R = 6, V = 5000;
  Pair logits_c_g = put(B, normal(R * V, 80, 3.0f), R, V);
  SamplingBatch sb;
  sb.mask_words = (V + 31) / 32;
  for (int r = 0; r < R; ++r) {
    SamplingRow row;
    row.temperature = r % 3 == 0 ? 0.0f : 0.8f + 0.2f * r;
    row.top_k = r == 2 ? 40 : 0;
    row.top_p = r == 4 ? 0.7f : 1.0f;
    row.u = 0.1 + 0.13 * r;
    row.logprobs = r == 1 ? 3 : -1;
    row.repetition_penalty = r >= 3 ? 1.3f : 1.0f;
    row.frequency_penalty = r >= 3 ? 0.5f : 0.0f;
    row.history_begin = static_cast<int32_t>(sb.history.size());
    if (r >= 3)
      for (int j = 0; j < 50; ++j) sb.history.push_back({(j * 97 + r) % V, j % 3});
    row.history_end = static_cast<int32_t>(sb.history.size());
    row.bias_begin = static_cast<int32_t>(sb.biases.size());
    sb.biases.push_back({(r * 31) % V, 3.0f});
    sb.biases.push_back({(r * 31 + 1) % V, -std::numeric_limits<float>::infinity()});
    row.bias_end = static_cast<int32_t>(sb.biases.size());
    if (r == 5) {
      row.mask_row = 0;
      sb.allowed.assign(sb.mask_words, 0);
      for (int t = 0; t < V; t += 7) sb.allowed[t / 32] |= 1u << (t % 32);
    }
    sb.rows.push_back(row);
  }
  std::vector<SampleResult> want, got;
  B.cpu.sample(logits_c_g.c, sb, want);
  B.gpu->sample(logits_c_g.g, sb, got);
  expect_exact(std::string("sample_") + B.mode(), "6x5000", token_values(got), token_values(want));
  ASSERT_EQ(got[1].top.size(), 3u);
  EXPECT_NEAR(got[1].logprob, want[1].logprob, 1e-4);
  EXPECT_EQ(got[5].token % 7, 0);  // the mask holds
}

// A batch of greedy rows only takes the argmax path (argmax.cu, no parameter upload): the
// same tokens as the CPU at K3's vocab, alone and at batch 8, with planted ties (two ids
// share each row's maximum: the lower wins), with a bias that masks the lower one (the
// higher wins), penalties, and a row asking for logprobs.
TEST_P(BackendOps, GreedySamplingOfAWholeBatch) {
  Backends& B = b();
  const int V = 163840;
  for (int R : {1, 8}) {
    auto v = normal(static_cast<size_t>(R) * V, 90 + R, 3.0f);
    for (int r = 0; r < R; ++r) {
      v[static_cast<size_t>(r) * V + 1000 + r] = 50.0f;
      v[static_cast<size_t>(r) * V + 150000 - r] = 50.0f;
    }
    Pair logits = put(B, v, R, V);
    SamplingBatch sb;
    for (int r = 0; r < R; ++r) {
      SamplingRow row;
      row.temperature = 0.0f;
      row.logprobs = r == 2 ? 2 : -1;
      row.bias_begin = static_cast<int32_t>(sb.biases.size());
      if (r % 2 == 1) sb.biases.push_back({1000 + r, -std::numeric_limits<float>::infinity()});
      row.bias_end = static_cast<int32_t>(sb.biases.size());
      row.history_begin = static_cast<int32_t>(sb.history.size());
      if (r == 3) {
        row.repetition_penalty = 1.5f;
        for (int j = 0; j < 20; ++j) sb.history.push_back({(j * 7919) % V, 1});
      }
      row.history_end = static_cast<int32_t>(sb.history.size());
      sb.rows.push_back(row);
    }
    std::vector<SampleResult> want, got;
    B.cpu.sample(logits.c, sb, want);
    B.gpu->sample(logits.g, sb, got);
    const std::vector<float> wt = token_values(want), gt = token_values(got);
    for (int r = 0; r < R; ++r) {
      EXPECT_EQ(got[r].token, r % 2 == 1 ? 150000 - r : 1000 + r) << "row " << r;
    }
    expect_exact(std::string("sample_greedy_") + B.mode(), std::to_string(R) + "x163840", gt, wt);
    if (R > 2) {
      ASSERT_EQ(got[2].top.size(), 2u);
      EXPECT_NEAR(got[2].logprob, want[2].logprob, 1e-4);
    }
  }
}

// DSpark's Markov and confidence heads (Ops::dspark_markov): the demo draft's shapes (vocab
// 2560, rank 64, hidden 256, blocks of 8), three blocks, seven slots each. The heads read F32
// in both modes (the draft loads them so); the tokens must agree exactly while the biased
// logits agree, and a block's later slots follow from its earlier tokens.
TEST_P(BackendOps, DSparkMarkovHeads) {
  Backends& B = b();
  const int V = 2560, r = 64, H = 256, block = 8, n_blocks = 3, n_slots = 7;
  const int rows = block * n_blocks;
  for (bool with_conf : {true, false}) {
    Pair logits = put(B, normal(static_cast<size_t>(rows) * V, 301, 3.0f), rows, V);
    Pair w1 = put(B, normal(static_cast<size_t>(V) * r, 302, 0.3f), V, r);
    Pair w2 = put(B, normal(static_cast<size_t>(V) * r, 303, 0.3f), V, r);
    Pair h = put(B, normal(static_cast<size_t>(rows) * H, 304), rows, H);
    Pair conf_w = with_conf ? put(B, normal(H + r, 305, 0.1f), 1, H + r) : Pair{};
    std::vector<int32_t> ids(rows, 0);
    for (int b = 0; b < n_blocks; ++b) ids[b * block] = 17 + 991 * b;
    Pair id = put_i32(B, ids, rows, 1);
    Pair tokens = put_i32(B, std::vector<int32_t>(rows, -1), rows, 1);
    Pair conf = out(B, rows, 1);
    B.cpu.dspark_markov(logits.c, w1.c, w2.c, id.c.as<int32_t>(), block, n_slots, h.c, conf_w.c, 0.25f, tokens.c,
                        conf.c);
    B.gpu->dspark_markov(logits.g, w1.g, w2.g, id.g.as<int32_t>(), block, n_slots, h.g, conf_w.g, 0.25f, tokens.g,
                         conf.g);
    const std::string what = std::string("dspark_markov_") + (with_conf ? "conf_" : "") + B.mode();
    expect_close(what, "3x8x2560 r64", err(B, logits), 2e-6);
    std::vector<int32_t> want(rows), got(rows);
    B.cpu.download(tokens.c, want.data());
    B.gpu->download(tokens.g, got.data());
    EXPECT_EQ(got, want) << what;
    for (int b = 0; b < n_blocks; ++b) EXPECT_EQ(want[b * block + block - 1], -1) << "slot 7 is past n_slots";
    if (with_conf) expect_close(what + "_confidence", "24", err(B, conf), 1e-5);
  }
}

// INT4 (compressed-tensors pack-quantized, group 32) routed experts, the K2 release's (issue
// 40): the same random words and bf16 scales on both backends, top K of E experts (ids
// (5t + 3k) % (E - 3): K <= 13 distinct per token, about T K / 13 tokens an expert), `first`
// .. `first + count` held (fewer than E: an expert-parallel shard, whose other slots add
// nothing). fast: the words repacked with MOONRUN_INT4_FAST=1 (cuda_ops.cpp), so that the
// MXFP4 kernels' fast paths take them where their shapes allow (bf16 x; the f32 mode's fp32 x
// still goes to the reference kernel, which then reads the re-laid words).
struct Int4Shape {
  int T, K, Dm, I, first, count;
};


void int4_experts_match_the_cpu(Backends& B, const std::vector<Int4Shape>& shapes, bool fast) {
  const int E = 16;
  for (const Int4Shape& sh : shapes) {
    const int Tn = sh.T, K = sh.K, Dn = sh.Dm, In = sh.I;
    std::vector<int32_t> ids;
    for (int t = 0; t < Tn; ++t)
      for (int k = 0; k < K; ++k) ids.push_back((t * 5 + k * 3) % (E - 3));  // distinct per token
    Pair id = put_i32(B, ids, Tn, K);
    Pair wt = put(B, optest::random_uniform(Tn * K, 80 + Tn, 0.0f, 1.0f), Tn, K);
    Pair x = put(B, normal(static_cast<size_t>(Tn) * Dn, 81 + Tn), Tn, Dn, B.gpu->act_dtype());
    // c: the CPU's INT4; g: the GPU's INT4; d: the GPU's dense fp32 experts holding the
    // dequantised values (cpu::dequantize_int4_g32: exact in fp32).
    struct Experts {
      ExpertMatrices c, g, d;
    };
    auto experts = [&](int out_f, int in_f, unsigned seed) {
      const int64_t rows = static_cast<int64_t>(sh.count) * out_f;
      std::vector<uint32_t> words(static_cast<size_t>(rows) * in_f / 8);
      std::vector<uint16_t> scales(static_cast<size_t>(rows) * in_f / 32);
      testing::Rng r(seed);
      for (auto& v : words) v = r.bits();
      // Positive scales near absmax / 7.5 of an nn.Linear-sized weight, so sums stay O(1).
      const float base = 1.0f / (7.5f * std::sqrt(static_cast<float>(in_f)));
      for (auto& v : scales) v = f32_to_bf16(base * r.uniform(0.5f, 2.0f));
      std::vector<float> dense(static_cast<size_t>(rows) * in_f);
      cpu::dequantize_int4_g32(words.data(), scales.data(), static_cast<int>(rows), in_f, dense.data());
      Experts e;
      for (ExpertMatrices* m : {&e.c, &e.g, &e.d}) {
        m->num_experts = sh.count;
        m->first_expert = sh.first;
        m->stacked.out = out_f;
        m->stacked.in = in_f;
      }
      std::optional<ScopedEnv> env;
      env.emplace("MOONRUN_INT4_FAST", fast ? "1" : "0");
      for (Ops* ops : {static_cast<Ops*>(&B.cpu), B.gpu.get()}) {
        ExpertMatrices& m = ops == &B.cpu ? e.c : e.g;
        m.stacked.format = WeightFormat::int4_g32_sym;
        m.stacked.w = ops->alloc(rows, in_f / 8, DType::I32, "int4 words");
        m.stacked.scales = ops->alloc(rows, in_f / 32, DType::BF16, "int4 scales");
        ops->upload(m.stacked.w, 0, words.data(), words.size() * sizeof(uint32_t));
        ops->upload(m.stacked.scales, 0, scales.data(), scales.size() * sizeof(uint16_t));
        ops->repack_experts(m);  // as the loader does (the fast layout only with the switch)
      }
      // Re-laid exactly when the switch is on and the rows are whole 64-wide slices.
      EXPECT_FALSE(e.c.stacked.backend_layout);
      EXPECT_EQ(e.g.stacked.backend_layout, fast && in_f % 64 == 0) << out_f << "x" << in_f;
      e.d.stacked.w = testing::upload(*B.gpu, dense, rows, in_f, DType::F32);
      return e;
    };
    const Experts w1 = experts(In, Dn, 90), w3 = experts(In, Dn, 91), w2 = experts(Dn, In, 92);
    const ActivationParams swiglu{false, 0.0f, 0.0f};  // K2's
    Pair y = out(B, Tn, Dn);
    Tensor y_dense = B.gpu->alloc(Tn, Dn, DType::F32, "o");
    B.cpu.moe_experts(x.c, id.c, wt.c, w1.c, w3.c, w2.c, swiglu, y.c);
    B.gpu->moe_experts(x.g, id.g, wt.g, w1.g, w3.g, w2.g, swiglu, y.g);
    B.gpu->moe_experts(x.g, id.g, wt.g, w1.d, w3.d, w2.d, swiglu, y_dense);
    const std::string name = std::to_string(Tn) + "x" + std::to_string(Dn) + "x" + std::to_string(In) + "_top" +
                             std::to_string(K) + (sh.count < E ? "_shard" : "");
    const std::string op = std::string(fast ? "moe_experts_int4_fast_" : "moe_experts_int4_") + B.mode();
    // Against the CPU twin. Both see the same fp32 weights (u4 - 8 times a bf16 scale is
    // exact; the fast kernels multiply each group's fp32 sums of x * q by it) and the same
    // x; in f32 mode they differ only in the order of the fp32 sums (per lane and butterfly
    // here, the CPU's matmul order there), a few ulps of the O(1) outputs, so fp32's 2e-5
    // (normalised to the largest output) holds with room. In bf16 mode the GPU stores h =
    // act(gate, up) in bf16 between the projections (the CPU keeps fp32): one bf16 rounding
    // (relative 2^-9) per h entry, summed over the down projection with random signs, the
    // same allowance as the MXFP4 experts' check above (2e-2).
    expect_close(op, name, err(B, y), B.tol(2e-2));
    const std::vector<float> got = testing::download(*B.gpu, y.g), dense = testing::download(*B.gpu, y_dense);
    if (!fast || B.f32) {
      // Against the GPU's own dense fp32 reference kernel on the dequantised weights: the INT4
      // reference kernel (which takes fp32 x, and every shape without the switch) walks the
      // same groups in the same lane order with the same fmaf chain, so the results are
      // bit-identical (any difference is a decoding error, not rounding) - re-laid words too.
      expect_exact(op + "_vs_dense", name, got, dense);
    } else {
      // The fast kernels sum in another order (MMA fragments, per-group partial sums): the
      // same bf16 h roundings apart as against the CPU.
      double worst = 0.0, scale = 1e-30;
      for (size_t i = 0; i < got.size(); ++i) {
        worst = std::max(worst, std::abs(static_cast<double>(got[i]) - dense[i]));
        scale = std::max(scale, std::abs(static_cast<double>(dense[i])));
      }
      expect_close(op + "_vs_dense", name, worst / scale, 2e-2);
    }
  }
}

// Without the switch (the default): the reference kernel on the words as stored. Shapes: 1, 5
// and 33 tokens, top 2, 3 and 4; widths of 1056 and 1088 inputs (33 and 34 scale groups: past
// one group per lane, the last lanes' second group) and of 96 .. 320; 33 tokens as a shard.
TEST_P(BackendOps, Int4ExpertsMatchTheCpu) {
  const int E = 16;
  int4_experts_match_the_cpu(b(),
                             {{1, 2, 1056, 96, 0, E}, {5, 3, 256, 1088, 0, E}, {33, 4, 128, 320, 0, E},
                              {33, 4, 128, 320, 4, 8}},
                             /*fast=*/false);
}

// MOONRUN_INT4_FAST=1, decode: at most 8 tokens, so 1 .. 8 tokens an expert, the whole-tile
// stream kernel where in % 64 == 0, out % 32 == 0 and the tile fits (moe_ops.h): 1 token x
// top 8 (one token an expert); 8 x top 2 and 8 x top 8 (up to 8 an expert); gate/up in 1024
// (16 slices: 8 copied, 8 read as the tail) and down in 576 (9: 1 copied); down in 256 (4
// slices, all tail); K2's hidden width 7168 (gate/up past two tiles' shared memory: the
// stream kernel with one m16 tile a block, MOONRUN_EXPERT_ONE_TILE=1 set for this test, 8 rows
// of gate and of up; down in 256); a shard;
// and 1056 x 96, neither a whole number of 64-wide slices: not re-laid, the reference kernel.
TEST_P(BackendOps, Int4FastDecodeExpertsMatchTheCpu) {
  const int E = 16;
  ScopedEnv one_tile("MOONRUN_EXPERT_ONE_TILE", "1");
  int4_experts_match_the_cpu(b(),
                             {{1, 8, 1024, 576, 0, E}, {8, 2, 1024, 576, 0, E}, {8, 8, 512, 256, 0, E},
                              {4, 8, 7168, 256, 0, E}, {8, 8, 1024, 576, 4, 8}, {1, 2, 1056, 96, 0, E}},
                             /*fast=*/true);
}

// MOONRUN_INT4_FAST=1, prefill: the register-fed tensor-core kernel (expert_linear_mma.cu;
// INT4 does not take the wgmma kernel) at 9 .. 256 tokens (32-token tiles: 150 x top 8, ~92
// tokens an expert; 250 x top 8, ~154) and past 256 (64-token tiles: 300 x top 8, ~185), and
// 21 tokens with down's input 96 (not whole 64-wide slices: not re-laid, the reference
// kernel; every INT4 width is a multiple of its group of 32); K2's hidden width at 150; a shard.
TEST_P(BackendOps, Int4FastPrefillExpertsMatchTheCpu) {
  const int E = 16;
  int4_experts_match_the_cpu(b(),
                             {{150, 8, 256, 192, 0, E}, {250, 8, 512, 256, 0, E}, {300, 8, 128, 320, 0, E},
                              {21, 4, 64, 96, 0, E}, {150, 8, 7168, 128, 0, E}, {250, 8, 256, 192, 4, 8}},
                             /*fast=*/true);
}

// MOONRUN_INT4_WGMMA=1 on top of MOONRUN_INT4_FAST=1, prefill-sized steps (>= kWgmmaMinTokens
// tokens, moe_ops.h; sm_90a): the warpgroup-MMA kernel of expert_linear_wgmma.cu takes the
// re-laid words where out % 128 == 0, feeding q * scale rounded to bf16 (its contract: the
// header) - K2's hidden width 7168 (224 scale groups: gate/up's shared-memory scales at their
// largest), 600 tokens x top 8 at width 256 (~370 tokens an expert: two 256-token passes),
// and a shard. A permuted k, a wrong scale group or a lost pass is an O(1) error; the bf16
// rounding of the weights is 2^-9 relative, inside the bf16 check's allowance. On the f32
// backend x is fp32 and the reference kernel runs.
TEST_P(BackendOps, Int4WgmmaPrefillExpertsMatchTheCpu) {
  const int E = 16;
  ScopedEnv wgmma("MOONRUN_INT4_WGMMA", "1");
  int4_experts_match_the_cpu(b(), {{600, 8, 256, 256, 0, E}, {520, 8, 7168, 256, 0, E}, {600, 8, 256, 128, 4, 8}},
                             /*fast=*/true);
}

// MOONRUN_EXPERT_MULTI_PASS=1: decode batches past 8 tokens (32 .. 128: K2 at batch 32 .. 128
// gives an expert one to three tokens, but the step has more than one n8 fragment's worth)
// in the whole-tile kernel, each block's slots in passes of 8 over its copied tile: 32 and 128
// tokens x top 8 over 13 experts (~20 and ~80 slots an expert), K2's hidden width (one-tile
// blocks) at 24 tokens, and a shard.
TEST_P(BackendOps, Int4MultiPassDecodeExpertsMatchTheCpu) {
  const int E = 16;
  ScopedEnv multi("MOONRUN_EXPERT_MULTI_PASS", "1");
  int4_experts_match_the_cpu(b(),
                             {{32, 8, 1024, 576, 0, E}, {128, 8, 512, 256, 0, E}, {24, 8, 7168, 256, 0, E},
                              {64, 8, 1024, 576, 4, 8}},
                             /*fast=*/true);
}

INSTANTIATE_TEST_SUITE_P(Cuda, BackendOps, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "Float32" : "Bfloat16"; });

}  // namespace
}  // namespace moonrun
