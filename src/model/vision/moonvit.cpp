#include "model/vision/moonvit.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace moonrun {

// ---- the weights -------------------------------------------------------------------------

void describe_moonvit_weights(const ModelConfig& cfg, MoonVitWeights& w, WeightSink& sink) {
  const VisionConfig& v = cfg.vision;
  if (!v.enabled) return;
  const int64_t H = v.hidden_size, P = v.patch_size, Q = v.qkv_hidden_size, I = v.intermediate_size;
  const int64_t M = v.merged_width(), T = v.text_hidden_size;
  auto mat = [&](Matrix& dst, const std::string& name, int64_t out, int64_t in) {
    sink.matrix(dst, name, static_cast<int>(out), static_cast<int>(in), ShardRule::replicated);
  };
  auto vec = [&](Tensor& dst, const std::string& name, int64_t n) {
    sink.f32(dst, name, DType::BF16, {n}, 1, n, ShardRule::replicated);
  };
  // The patch embedding is a Conv2d with stride = kernel: one dot product per patch, i.e. a
  // linear over the patch's values in (channel, y, x) order. Kept F32 (its input is F32).
  const bool bias = v.linear_bias, ln = v.norm == VisionNorm::kLayerNorm;
  if (bias) vec(w.patch_embed_b, "vision_tower.patch_embed.proj.bias", H);
  sink.f32(w.patch_embed.w, "vision_tower.patch_embed.proj.weight", DType::BF16, {H, 3, P, P}, H, 3 * P * P,
           ShardRule::replicated);
  w.patch_embed.out = static_cast<int>(H);
  w.patch_embed.in = static_cast<int>(3 * P * P);
  sink.f32(w.pos_emb, "vision_tower.patch_embed.pos_emb.weight", DType::BF16, {v.pos_emb_height, v.pos_emb_width, H},
           static_cast<int64_t>(v.pos_emb_height) * v.pos_emb_width, H, ShardRule::replicated);
  w.layers.resize(v.num_layers);
  for (int i = 0; i < v.num_layers; ++i) {
    MoonVitLayerWeights& l = w.layers[i];
    const std::string b = "vision_tower.encoder.blocks." + std::to_string(i) + ".";
    vec(l.norm0, b + "norm0.weight", H);
    vec(l.norm1, b + "norm1.weight", H);
    mat(l.wqkv, b + "wqkv.weight", 3 * Q, H);
    mat(l.wo, b + "wo.weight", H, Q);
    mat(l.fc0, b + "mlp.fc0.weight", I, H);
    mat(l.fc1, b + "mlp.fc1.weight", H, I);
    if (ln) {
      vec(l.norm0_b, b + "norm0.bias", H);
      vec(l.norm1_b, b + "norm1.bias", H);
    }
    if (bias) {
      vec(l.wqkv_b, b + "wqkv.bias", 3 * Q);
      vec(l.wo_b, b + "wo.bias", H);
      vec(l.fc0_b, b + "mlp.fc0.bias", I);
      vec(l.fc1_b, b + "mlp.fc1.bias", H);
    }
  }
  vec(w.final_norm, "vision_tower.encoder.final_layernorm.weight", H);
  if (ln) vec(w.final_norm_b, "vision_tower.encoder.final_layernorm.bias", H);
  // nn.Sequential(Linear, GELU, Linear): indices 0 and 2.
  mat(w.proj0, "mm_projector.proj.0.weight", M, M);
  mat(w.proj2, "mm_projector.proj.2.weight", T, M);
  if (v.projector == VisionProjector::kPatchMergerV2) {
    vec(w.post_norm, "mm_projector.post_norm.weight", T);
  } else {  // patchmerger: LayerNorm(mm_hidden_size) before the merge's linears, biases on both
    vec(w.pre_norm, "mm_projector.pre_norm.weight", H);
    vec(w.pre_norm_b, "mm_projector.pre_norm.bias", H);
    vec(w.proj0_b, "mm_projector.proj.0.bias", M);
    vec(w.proj2_b, "mm_projector.proj.2.bias", T);
  }
}

// ---- host-side inputs --------------------------------------------------------------------

namespace {

// One output coordinate's taps along an axis of `in` samples: source indices and weights,
// as PyTorch's upsample kernels compute them for align_corners=False (in float: the op-math
// type of a float32 table). scale = in / out; source = scale * (dst + 0.5) - 0.5.
struct AxisTaps {
  int n = 0;
  int index[4] = {0, 0, 0, 0};
  float weight[4] = {0, 0, 0, 0};
};

// upsample_bilinear2d: the source clamped at 0; the far neighbour is the edge itself at
// the border.
AxisTaps bilinear_taps(int in, int out, int dst) {
  const float scale = static_cast<float>(in) / static_cast<float>(out);
  float src = scale * (static_cast<float>(dst) + 0.5f) - 0.5f;
  if (src < 0) src = 0;
  AxisTaps t;
  t.n = 2;
  t.index[0] = static_cast<int>(src);
  t.index[1] = t.index[0] + (t.index[0] < in - 1 ? 1 : 0);
  t.weight[1] = src - static_cast<float>(t.index[0]);
  t.weight[0] = 1.0f - t.weight[1];
  return t;
}

// upsample_bicubic2d: the source is not clamped; taps floor(src) - 1 .. floor(src) + 2,
// each index clamped into the table (upsample_get_value_bounded); Keys' cubic with A = -0.75
// (get_cubic_upsample_coefficients); the index guarded to in - 1 and t to [0, 1]
// (guard_index_and_lambda).
AxisTaps bicubic_taps(int in, int out, int dst) {
  constexpr float A = -0.75f;
  const float scale = static_cast<float>(in) / static_cast<float>(out);
  const float src = scale * (static_cast<float>(dst) + 0.5f) - 0.5f;
  const int i0 = std::min(static_cast<int>(std::floor(src)), in - 1);
  const float t = std::min(std::max(src - static_cast<float>(i0), 0.0f), 1.0f);
  auto near = [&](float x) { return ((A + 2) * x - (A + 3)) * x * x + 1; };    // |x| <= 1
  auto far = [&](float x) { return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A; };  // 1 < |x| < 2
  AxisTaps r;
  r.n = 4;
  r.weight[0] = far(t + 1.0f);
  r.weight[1] = near(t);
  r.weight[2] = near(1.0f - t);
  r.weight[3] = far(2.0f - t);
  for (int k = 0; k < 4; ++k) r.index[k] = std::min(std::max(i0 - 1 + k, 0), in - 1);
  return r;
}

std::vector<float> separable_resize(const std::vector<float>& table, int h0, int w0, int channels, int h, int w,
                                    AxisTaps (*taps)(int, int, int)) {
  if (h == h0 && w == w0) return table;  // the reference skips the resize at the table's own size
  std::vector<float> out(static_cast<size_t>(h) * w * channels);
  std::vector<AxisTaps> xs(w);
  for (int x = 0; x < w; ++x) xs[x] = taps(w0, w, x);
  std::vector<float> row(channels);
  for (int y = 0; y < h; ++y) {
    const AxisTaps ty = taps(h0, h, y);
    for (int x = 0; x < w; ++x) {
      const AxisTaps& tx = xs[x];
      float* o = &out[(static_cast<size_t>(y) * w + x) * channels];
      std::fill(o, o + channels, 0.0f);
      // Along x within each source row, then those rows along y.
      for (int i = 0; i < ty.n; ++i) {
        std::fill(row.begin(), row.end(), 0.0f);
        for (int j = 0; j < tx.n; ++j) {
          const float* v = &table[(static_cast<size_t>(ty.index[i]) * w0 + tx.index[j]) * channels];
          for (int c = 0; c < channels; ++c) row[c] += tx.weight[j] * v[c];
        }
        for (int c = 0; c < channels; ++c) o[c] += ty.weight[i] * row[c];
      }
    }
  }
  return out;
}

}  // namespace

std::vector<float> bilinear_resize(const std::vector<float>& table, int h0, int w0, int channels, int h, int w) {
  return separable_resize(table, h0, w0, channels, h, w, bilinear_taps);
}

std::vector<float> bicubic_resize(const std::vector<float>& table, int h0, int w0, int channels, int h, int w) {
  return separable_resize(table, h0, w0, channels, h, w, bicubic_taps);
}

std::vector<float> resize_pos_table(const std::vector<float>& table, int h0, int w0, int channels, int h, int w,
                                    PosEmbInterpolation mode) {
  return mode == PosEmbInterpolation::kBicubic ? bicubic_resize(table, h0, w0, channels, h, w)
                                                : bilinear_resize(table, h0, w0, channels, h, w);
}

std::vector<float> rope_table(int grid_h, int grid_w, int head_dim, float theta) {
  // The reference (Rope2DPosEmbRepeated): frequency j = theta^(-4j/d) for j < d/4, in
  // float32; complex pair 2j turns by column * freq_j, pair 2j+1 by row * freq_j.
  const int quarter = head_dim / 4;
  std::vector<float> freqs(quarter);
  for (int j = 0; j < quarter; ++j)
    freqs[j] = 1.0f / std::pow(theta, static_cast<float>(4 * j) / static_cast<float>(head_dim));
  std::vector<float> out(static_cast<size_t>(grid_h) * grid_w * head_dim);
  for (int y = 0; y < grid_h; ++y)
    for (int x = 0; x < grid_w; ++x) {
      float* o = &out[(static_cast<size_t>(y) * grid_w + x) * head_dim];
      for (int j = 0; j < quarter; ++j) {
        const float ax = static_cast<float>(x) * freqs[j], ay = static_cast<float>(y) * freqs[j];
        o[4 * j + 0] = std::cos(ax);
        o[4 * j + 1] = std::sin(ax);
        o[4 * j + 2] = std::cos(ay);
        o[4 * j + 3] = std::sin(ay);
      }
    }
  return out;
}

std::vector<int32_t> merge_order(int grid_h, int grid_w, int merge_h, int merge_w) {
  // tpool_patch_merger: view (h/mh, mh, w/mw, mw) -> permute to (h/mh, w/mw, mh, mw).
  std::vector<int32_t> order;
  order.reserve(static_cast<size_t>(grid_h) * grid_w);
  for (int by = 0; by < grid_h / merge_h; ++by)
    for (int bx = 0; bx < grid_w / merge_w; ++bx)
      for (int ky = 0; ky < merge_h; ++ky)
        for (int kx = 0; kx < merge_w; ++kx) order.push_back((by * merge_h + ky) * grid_w + bx * merge_w + kx);
  return order;
}

// ---- the forward -------------------------------------------------------------------------

MoonVit::MoonVit(const ModelConfig& cfg, MoonVitWeights weights) : cfg_(cfg), w_(std::move(weights)) {}

int64_t MoonVit::scratch_bytes(int64_t n_patches) const {
  if (!enabled()) return 0;
  // encode()'s temporaries per patch row, all counted as F32: the inputs (patch values,
  // position rows, RoPE angles, merge index), the stream and its normed copy, qkv, the
  // attention output twice, the MLP hidden twice, the merged rows twice, and per merged
  // token the projector's hidden twice and its output; plus alignment slack.
  const VisionConfig& v = vc();
  const int64_t per_patch = static_cast<int64_t>(v.patch_values()) + v.head_dim() + 1 + 6 * v.hidden_size +
                            5 * v.qkv_hidden_size + 2 * v.intermediate_size +
                            (2 * v.merged_width() + v.text_hidden_size) / v.merge_rows() + 2 * v.hidden_size;
  // K2.5: a bias tile as wide as the widest biased output, the LayerNorm's centred copy and
  // the zero row index per row; the centring matrix [hidden, hidden] once.
  const bool k25 = v.linear_bias || v.norm == VisionNorm::kLayerNorm || v.projector == VisionProjector::kPatchMerger;
  const int64_t extra = k25 ? std::max<int64_t>({3 * v.qkv_hidden_size, v.intermediate_size, v.hidden_size}) +
                                  v.hidden_size + 1
                            : 0;
  const int64_t once = k25 ? static_cast<int64_t>(v.hidden_size) * v.hidden_size * 4 : 0;
  return n_patches * (per_patch + extra) * 4 + once + (int64_t{1} << 20);
}

std::vector<float> MoonVit::encode(Ops& ops, std::span<const vision::ImagePatches* const> images) {
  MR_CHECK(enabled()) << "MoonVit::encode without a vision tower";
  ScratchScope scope(ops);
  const VisionConfig& v = vc();
  const int64_t H = v.hidden_size, Q = v.qkv_hidden_size, I = v.intermediate_size, M = v.merged_width();
  const int64_t TH = v.text_hidden_size, PV = v.patch_values(), d = v.head_dim();
  const DType act = ops.act_dtype();
  if (pos_table_host_.empty()) {
    pos_table_host_.resize(static_cast<size_t>(w_.pos_emb.numel()));
    ops.download(w_.pos_emb, pos_table_host_.data());
  }

  // The batch of images as one sequence of patch rows; each image's grid gives its
  // position rows, its rotary angles and its merge order.
  std::vector<int32_t> seq_starts{0};
  int64_t n_tokens = 0;
  std::vector<float> patches, pos, rope;
  std::vector<int32_t> order;
  for (const vision::ImagePatches* im : images) {
    MR_CHECK(im->patch_size == v.patch_size && im->values.size() == static_cast<size_t>(im->grid_h) * im->grid_w * PV &&
             im->grid_h % v.merge_kernel_h == 0 && im->grid_w % v.merge_kernel_w == 0)
        << "image patches do not fit the tower";
    const int32_t first = seq_starts.back();
    patches.insert(patches.end(), im->values.begin(), im->values.end());
    const std::vector<float> p = resize_pos_table(pos_table_host_, v.pos_emb_height, v.pos_emb_width,
                                                  static_cast<int>(H), im->grid_h, im->grid_w, v.pos_emb_interpolation);
    pos.insert(pos.end(), p.begin(), p.end());
    const std::vector<float> r = rope_table(im->grid_h, im->grid_w, static_cast<int>(d));
    rope.insert(rope.end(), r.begin(), r.end());
    for (int32_t row : merge_order(im->grid_h, im->grid_w, v.merge_kernel_h, v.merge_kernel_w))
      order.push_back(first + row);
    seq_starts.push_back(first + im->grid_h * im->grid_w);
    n_tokens += (im->grid_h / v.merge_kernel_h) * (im->grid_w / v.merge_kernel_w);
  }
  const int64_t N = seq_starts.back();  // patch rows
  auto upload = [&](const std::vector<float>& host, int64_t cols) {
    Tensor t = ops.scratch(static_cast<int64_t>(host.size()) / cols, cols, DType::F32);
    ops.upload(t, 0, host.data(), host.size() * sizeof(float));
    return t;
  };
  const Tensor x = upload(patches, PV);    // [N, 3*p*p]
  const Tensor pos_t = upload(pos, H);     // [N, hidden]
  const Tensor rope_t = upload(rope, d);   // [N, head_dim]
  Tensor order_t = ops.scratch(N, 1, DType::I32);
  ops.upload(order_t, 0, order.data(), order.size() * sizeof(int32_t));

  // K2.5's pieces, composed from the ops. bias(y, b): y += b on every row (b tiled by a
  // gather of row 0). norm(x, w, b, eps, y): RMSNorm, or LayerNorm as RMSNorm of the centred
  // row (x C with C = I - 1/H: mean(y^2) of a centred row is the biased variance) plus b.
  const bool layer_norm = v.norm == VisionNorm::kLayerNorm;
  const bool needs_tile = v.linear_bias || layer_norm || v.projector == VisionProjector::kPatchMerger;
  Tensor zero_rows, tile_buf, centred;
  Matrix centre;
  if (needs_tile) {
    zero_rows = ops.scratch(N, 1, DType::I32);
    const std::vector<int32_t> zeros(static_cast<size_t>(N), 0);
    ops.upload(zero_rows, 0, zeros.data(), zeros.size() * sizeof(int32_t));
    tile_buf = ops.scratch(N, std::max<int64_t>({3 * Q, I, H}), DType::F32);
    centred = ops.scratch(N, H, DType::F32);
    std::vector<float> c(static_cast<size_t>(H * H));
    for (int64_t r = 0; r < H; ++r)
      for (int64_t k = 0; k < H; ++k) c[r * H + k] = (r == k ? 1.0f : 0.0f) - 1.0f / static_cast<float>(H);
    centre.w = ops.scratch(H, H, DType::F32);
    ops.upload(centre.w, 0, c.data(), c.size() * sizeof(float));
    centre.out = centre.in = static_cast<int>(H);
  }
  auto bias = [&](Tensor y, const Tensor& b) {
    if (b.empty()) return;
    Tensor t{tile_buf.data, DType::F32, y.rows, y.cols};  // [rows of y, cols of y] at the tile's start
    ops.gather_rows(b, zero_rows.as<int32_t>(), t);
    ops.add(y, t, y);
  };
  auto norm = [&](const Tensor& x, const Tensor& w, const Tensor& b, float eps, Tensor y) {
    if (!layer_norm) {
      ops.rmsnorm(x, w, eps, y);
      return;
    }
    Tensor xc = centred.rows_view(0, x.rows);
    ops.linear(x, centre, xc);
    if (y.dtype == DType::F32) {
      ops.rmsnorm(xc, w, eps, y);
      bias(y, b);
    } else {
      ops.rmsnorm(xc, w, eps, xc);
      bias(xc, b);
      ops.copy(xc, y);
    }
  };

  Tensor h = ops.scratch(N, H, DType::F32);  // the residual stream [N, hidden]
  ops.linear(x, w_.patch_embed, h);
  bias(h, w_.patch_embed_b);
  ops.add(h, pos_t, h);

  Tensor xa = ops.scratch(N, H, act);             // normed, the projections' input
  Tensor qkv = ops.scratch(N, 3 * Q, DType::F32);  // [N, 3 * qkv_hidden]
  Tensor att = ops.scratch(N, Q, DType::F32);
  Tensor att_a = act == DType::F32 ? att : ops.scratch(N, Q, act);
  Tensor o = ops.scratch(N, H, DType::F32);
  Tensor f = ops.scratch(N, I, DType::F32);        // the MLP's hidden [N, intermediate]
  Tensor f_a = act == DType::F32 ? f : ops.scratch(N, I, act);
  for (const MoonVitLayerWeights& l : w_.layers) {
    norm(h, l.norm0, l.norm0_b, v.norm_eps, xa);
    ops.linear(xa, l.wqkv, qkv);
    bias(qkv, l.wqkv_b);
    ops.vision_attention(qkv, rope_t, seq_starts, v.num_heads, static_cast<int>(d), att);
    if (att_a.data != att.data) ops.copy(att, att_a);
    ops.linear(att_a, l.wo, o);
    bias(o, l.wo_b);
    ops.add(h, o, h);
    norm(h, l.norm1, l.norm1_b, v.norm_eps, xa);
    ops.linear(xa, l.fc0, f);
    bias(f, l.fc0_b);
    ops.gelu(f, /*tanh_approx=*/true, f_a);
    ops.linear(f_a, l.fc1, o);
    bias(o, l.fc1_b);
    ops.add(h, o, h);
  }
  Tensor hn = ops.scratch(N, H, DType::F32);
  norm(h, w_.final_norm, w_.final_norm_b, v.norm_eps, hn);
  // patchmerger: its LayerNorm runs on each patch row, so before the merge's gather.
  if (v.projector == VisionProjector::kPatchMerger) norm(hn, w_.pre_norm, w_.pre_norm_b, v.projector_eps, hn);

  // 2x2 merge: each token's 4 patch rows side by side, [n_tokens, 4 * hidden].
  Tensor merged = ops.scratch(N, H, DType::F32);
  ops.gather_rows(hn, order_t.as<int32_t>(), merged);
  merged = merged.reshaped(M);
  Tensor merged_a = act == DType::F32 ? merged : ops.scratch(n_tokens, M, act);
  if (merged_a.data != merged.data) ops.copy(merged, merged_a);

  // The projector (PatchMergerMLPV2): linear -> exact GELU -> linear -> RMSNorm; K2.5's
  // patchmerger: the same linears with biases and no norm after them.
  Tensor p0 = ops.scratch(n_tokens, M, DType::F32);
  ops.linear(merged_a, w_.proj0, p0);
  bias(p0, w_.proj0_b);
  Tensor p0_a = act == DType::F32 ? p0 : ops.scratch(n_tokens, M, act);
  ops.gelu(p0, /*tanh_approx=*/false, p0_a);
  Tensor p2 = ops.scratch(n_tokens, TH, DType::F32);
  ops.linear(p0_a, w_.proj2, p2);
  bias(p2, w_.proj2_b);
  if (v.projector == VisionProjector::kPatchMergerV2) ops.rmsnorm(p2, w_.post_norm, v.projector_eps, p2);

  std::vector<float> rows(static_cast<size_t>(n_tokens) * TH);
  ops.download(p2, rows.data());
  return rows;
}

}  // namespace moonrun
