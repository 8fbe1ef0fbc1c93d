#pragma once
// The MoonViT-V2 vision tower and projector of a kimi_k3 checkpoint, typed (the reference's
// KimiK3VisionConfig, configuration_kimi_k3.py): parsed once from config.json's
// "vision_config", its missing fields taking the reference's defaults.
//
// When is there a tower? When vision_config gives the tower's width (vt_hidden_size). A
// vision_config that holds only patch_size and merge_kernel_size (our copy of the K3 config,
// the text-only fixtures) describes no weights: the model then serves text only and an
// image request is a 400.
//
// moonrun runs the tower as K3 ships it (RMSNorm blocks without biases, the MLP2 with tanh
// GELU, 2-D RoPE, a learned position table resized to each grid (bilinear, K3's, or
// bicubic), merging with temporal pooling ("sd2_tpool") and the "patchmergerv2" projector)
// and as K2.5 ships it (VisionFlavor::kK25, Moonshot's MoonViT3d of modeling_kimi_k25.py:
// LayerNorm blocks (eps 1e-5), a bias on every linear and on the patch embedding, a bicubic
// position table, and the "patchmerger" projector: LayerNorm per patch row, then linear ->
// GELU(exact) -> linear, with biases). The flavor sets the defaults of absent fields; any
// other choice is refused by name rather than run wrong.
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace moonrun {

// How the learned position table is resized to an image's grid (pos_emb_interpolation_mode:
// the F.interpolate mode, align_corners left at False).
enum class PosEmbInterpolation { kBilinear, kBicubic };
// The blocks' and the final norm (norm_type): nn.RMSNorm without a bias (K3) or nn.LayerNorm
// with one (K2.5).
enum class VisionNorm { kRmsNorm, kLayerNorm };
// The projector (mm_projector_type): "patchmergerv2" (K3: linear -> GELU -> linear ->
// RMSNorm, no biases) or "patchmerger" (K2.5: LayerNorm over each patch row of the merge,
// then linear -> GELU -> linear, with biases).
enum class VisionProjector { kPatchMergerV2, kPatchMerger };
// Whose reference the absent fields default to: K3's KimiK3VisionConfig or K2.5's.
enum class VisionFlavor { kK3, kK25 };

struct VisionConfig {
  bool enabled = false;
  int patch_size = 14;               // pixels per patch side
  int merge_kernel_h = 2;            // patches merged into one token, per side
  int merge_kernel_w = 2;
  int pos_emb_height = 64;           // the learned position table's grid (init_pos_emb_*)
  int pos_emb_width = 64;
  PosEmbInterpolation pos_emb_interpolation = PosEmbInterpolation::kBilinear;  // the reference's default
  int num_heads = 12;                // vt_num_attention_heads
  int num_layers = 27;               // vt_num_hidden_layers
  int hidden_size = 1024;            // vt_hidden_size: the tower's width
  int intermediate_size = 4096;      // vt_intermediate_size: the MLP's
  int qkv_hidden_size = 1536;        // attention width (heads x head_dim)
  // nn.RMSNorm without eps: torch adds the machine epsilon of the type it computes in, which
  // is float32 for a bfloat16, float16 or float32 tower (not bfloat16's 2^-7): 2^-23.
  float norm_eps = 1.1920928955078125e-07f;
  float projector_eps = 1e-5f;       // projector_ln_eps (the projector's post RMSNorm or pre LayerNorm)
  VisionNorm norm = VisionNorm::kRmsNorm;
  bool linear_bias = false;          // biases on wqkv, wo, the MLP and the patch embedding
  VisionProjector projector = VisionProjector::kPatchMergerV2;
  int text_hidden_size = 0;          // what the projector writes: the text model's width

  int head_dim() const { return qkv_hidden_size / num_heads; }
  int patch_values() const { return 3 * patch_size * patch_size; }  // one patch's inputs
  int merge_rows() const { return merge_kernel_h * merge_kernel_w; }
  int merged_width() const { return hidden_size * merge_rows(); }   // the projector's input
};

// `vc` is config.json's "vision_config" (an object; null or absent: no tower). `dtype_name`
// is the checkpoint's torch_dtype ("bfloat16" when absent), `text_hidden_size` the text
// model's width; `flavor` whose reference defaults the absent fields. Errors name
// "<source>: vision_config.<key>".
Result<VisionConfig> parse_vision_config(const nlohmann::json& vc, const std::string& dtype_name,
                                         int text_hidden_size, const std::string& source,
                                         VisionFlavor flavor = VisionFlavor::kK3);

}  // namespace moonrun
