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
// moonrun runs the tower as K3 ships it: RMSNorm blocks without biases, the MLP2 with tanh
// GELU, 2-D RoPE, a learned position table resized to each grid (bilinear, K3's, or
// bicubic), merging with temporal pooling ("sd2_tpool") and the "patchmergerv2" projector.
// Any other choice is refused by name rather than run wrong.
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace moonrun {

// How the learned position table is resized to an image's grid (pos_emb_interpolation_mode:
// the F.interpolate mode, align_corners left at False).
enum class PosEmbInterpolation { kBilinear, kBicubic };

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
  float projector_eps = 1e-5f;       // projector_ln_eps (the projector's post RMSNorm)
  int text_hidden_size = 0;          // what the projector writes: the text model's width

  int head_dim() const { return qkv_hidden_size / num_heads; }
  int patch_values() const { return 3 * patch_size * patch_size; }  // one patch's inputs
  int merge_rows() const { return merge_kernel_h * merge_kernel_w; }
  int merged_width() const { return hidden_size * merge_rows(); }   // the projector's input
};

// `vc` is config.json's "vision_config" (an object; null or absent: no tower). `dtype_name`
// is the checkpoint's torch_dtype ("bfloat16" when absent), `text_hidden_size` the text
// model's width. Errors name "<source>: vision_config.<key>".
Result<VisionConfig> parse_vision_config(const nlohmann::json& vc, const std::string& dtype_name,
                                         int text_hidden_size, const std::string& source);

}  // namespace moonrun
