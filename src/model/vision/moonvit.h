#pragma once
// MoonViT-V2 and the K3 projector (the reference's MoonViT3dPretrainedModel and
// PatchMergerMLPV2 in modeling_kimi_k3.py), written once against the ops:
//
//   patches [N, 3*14*14] -> patch embedding (the Conv2d as a linear over flattened patches)
//   + the learned position table, resized to the image's grid (bilinear or bicubic)
//   -> 27 x [RMSNorm -> packed qkv -> 2-D RoPE -> bidirectional attention -> wo, residual;
//            RMSNorm -> fc0 -> GELU(tanh) -> fc1, residual]
//   -> final RMSNorm -> 2x2 merge (4 neighbouring patches side by side in one row)
//   -> projector: linear -> GELU(exact) -> linear -> RMSNorm  = one text-width row per token.
//
// K2.5's MoonViT (VisionConfig's kLayerNorm / linear_bias / kPatchMerger, vision_config.h)
// is the same forward with LayerNorm for each RMSNorm, a bias after each linear, and the
// "patchmerger" projector: LayerNorm per patch row -> merge -> linear -> GELU(exact) -> linear.
// LayerNorm and the biases are composed from the ops (a centring linear, then rmsnorm; a
// bias row tiled by gather_rows, then add), so every backend that runs the K3 tower runs it.
//
// Each image attends only to its own patches. The rows come out in the order the prompt's
// placeholder run takes them: images in order, each one's merged tokens in raster order.
#include <cstdint>
#include <span>
#include <vector>

#include "backend/ops.h"
#include "model/config.h"
#include "model/vision/preprocess.h"
#include "model/weight_spec.h"

namespace moonrun {

struct MoonVitLayerWeights {
  Tensor norm0, norm1;  // [1, hidden] F32
  Tensor norm0_b, norm1_b, wqkv_b, wo_b, fc0_b, fc1_b;  // [1, n] F32; LayerNorm / linear_bias only
  Matrix wqkv;          // [3 * qkv_hidden, hidden]
  Matrix wo;            // [hidden, qkv_hidden]
  Matrix fc0;           // [intermediate, hidden]
  Matrix fc1;           // [hidden, intermediate]
};

struct MoonVitWeights {
  Matrix patch_embed;  // [hidden, 3 * patch * patch] F32: Conv2d [hidden, 3, p, p] flattened (c, y, x)
  Tensor pos_emb;      // [pos_h * pos_w, hidden] F32: the learned table, raster order
  std::vector<MoonVitLayerWeights> layers;
  Tensor final_norm;   // [1, hidden]
  Matrix proj0;        // [4 * hidden, 4 * hidden] (merged width)
  Matrix proj2;        // [text_hidden, 4 * hidden]
  Tensor post_norm;    // [1, text_hidden] (patchmergerv2)
  // K2.5: the biases (linear_bias / kLayerNorm) and the patchmerger's pre LayerNorm [1, hidden].
  Tensor patch_embed_b, final_norm_b, pre_norm, pre_norm_b, proj0_b, proj2_b;
  bool empty() const { return layers.empty(); }
};

// The checkpoint's vision_tower.* and mm_projector.* tensors, listed through `sink` (the
// loader and weight_spec both run it). Nothing is listed when cfg.vision.enabled is false.
void describe_moonvit_weights(const ModelConfig& cfg, MoonVitWeights& w, WeightSink& sink);

// The host-side inputs of one batch of images: the position table resized to each grid
// and the 2-D RoPE angles of each patch (both depend only on the grid, as the reference
// computes them outside its kernels).
//   bilinear_resize / bicubic_resize: F.interpolate(mode="bilinear" / "bicubic",
//   align_corners=False) of a [h0, w0, C] table to [h, w, C], in float as PyTorch computes
//   it (the table itself at its own size: the reference skips the call);
//   resize_pos_table: the one the config names.
//   rope_table: [grid_h * grid_w, head_dim]; pair i of a head (i < head_dim/2) rotates by
//   the column index (even i) or the row index (odd i) times theta^(-4 floor(i/2) / head_dim).
std::vector<float> bilinear_resize(const std::vector<float>& table, int h0, int w0, int channels, int h, int w);
std::vector<float> bicubic_resize(const std::vector<float>& table, int h0, int w0, int channels, int h, int w);
std::vector<float> resize_pos_table(const std::vector<float>& table, int h0, int w0, int channels, int h, int w,
                                    PosEmbInterpolation mode);
std::vector<float> rope_table(int grid_h, int grid_w, int head_dim, float theta = 10000.0f);
// Patch row of merged token t, slot k (k = ky * merge_w + kx): the 2x2 merge as a gather.
std::vector<int32_t> merge_order(int grid_h, int grid_w, int merge_h, int merge_w);

class MoonVit {
 public:
  MoonVit(const ModelConfig& cfg, MoonVitWeights weights);
  bool enabled() const { return !w_.empty(); }

  // Step scratch the tower takes for a batch of n_patches patch rows (what encode asks of
  // Ops::scratch): a backend with a fixed arena sets this much aside.
  int64_t scratch_bytes(int64_t n_patches) const;

  // The projector's rows for `images` (prompt order), [sum of num_tokens, text_hidden] F32,
  // downloaded to the host. Enqueues on ops; throws BackendError as every op does.
  std::vector<float> encode(Ops& ops, std::span<const vision::ImagePatches* const> images);

 private:
  const VisionConfig& vc() const { return cfg_.vision; }
  ModelConfig cfg_;
  MoonVitWeights w_;
  std::vector<float> pos_table_host_;  // w_.pos_emb downloaded once (the resize runs on the host)
};

}  // namespace moonrun
