#include "model/vision/vision_config.h"

#include <limits>

namespace moonrun {

namespace {

using json = nlohmann::json;

class VisionFields {
 public:
  VisionFields(const json& vc, std::string source) : vc_(vc), source_(std::move(source)) {}
  std::string where(const std::string& key) const { return source_ + ": vision_config." + key; }

  Status positive(const char* key, int& out) const {
    if (!vc_.contains(key) || vc_[key].is_null()) return Status::ok();  // the reference's default
    const json& v = vc_[key];
    if (!v.is_number_integer() || v.get<int64_t>() <= 0 || v.get<int64_t>() > (1 << 24))
      return failed_precondition(where(key) + " must be a positive integer, got " + v.dump());
    out = v.get<int>();
    return Status::ok();
  }
  Status number(const char* key, float& out) const {
    if (!vc_.contains(key) || vc_[key].is_null()) return Status::ok();
    const json& v = vc_[key];
    if (!v.is_number() || v.get<double>() <= 0)
      return failed_precondition(where(key) + " must be a positive number, got " + v.dump());
    out = v.get<float>();
    return Status::ok();
  }
  // A choice the reference offers but K3 does not use: only `wanted` (the K3 value) runs.
  Status only(const char* key, const json& wanted, const json& reference_default) const {
    const json got = vc_.contains(key) && !vc_[key].is_null() ? vc_[key] : reference_default;
    if (got != wanted)
      return failed_precondition(where(key) + " is " + got.dump() + "; moonrun runs MoonViT-V2 as K3 ships it (" +
                                 wanted.dump() + ")");
    return Status::ok();
  }

 private:
  const json& vc_;
  std::string source_;
};

}  // namespace

Result<VisionConfig> parse_vision_config(const json& vc, const std::string& dtype_name, int text_hidden_size,
                                         const std::string& source, VisionFlavor flavor) {
  VisionConfig c;
  const bool k25 = flavor == VisionFlavor::kK25;
  if (vc.is_null()) return c;
  if (!vc.is_object()) return failed_precondition(source + ": vision_config must be an object");
  if (!vc.contains("vt_hidden_size")) return c;  // no tower described (see the header)
  c.enabled = true;
  VisionFields f(vc, source);
  MR_RETURN_IF_ERROR(f.positive("patch_size", c.patch_size));
  if (vc.contains("merge_kernel_size")) {
    const json& m = vc["merge_kernel_size"];
    if (m.is_array() && m.size() == 2 && m[0].is_number_integer() && m[1].is_number_integer() && m[0].get<int>() > 0 &&
        m[1].get<int>() > 0) {
      c.merge_kernel_h = m[0].get<int>();
      c.merge_kernel_w = m[1].get<int>();
    } else if (m.is_number_integer() && m.get<int>() > 0) {
      c.merge_kernel_h = c.merge_kernel_w = m.get<int>();
    } else {
      return failed_precondition(f.where("merge_kernel_size") + " must be [h, w] of positive integers, got " +
                                 m.dump());
    }
  }
  MR_RETURN_IF_ERROR(f.positive("init_pos_emb_height", c.pos_emb_height));
  MR_RETURN_IF_ERROR(f.positive("init_pos_emb_width", c.pos_emb_width));
  MR_RETURN_IF_ERROR(f.positive("vt_num_attention_heads", c.num_heads));
  MR_RETURN_IF_ERROR(f.positive("vt_num_hidden_layers", c.num_layers));
  MR_RETURN_IF_ERROR(f.positive("vt_hidden_size", c.hidden_size));
  MR_RETURN_IF_ERROR(f.positive("vt_intermediate_size", c.intermediate_size));
  c.qkv_hidden_size = c.hidden_size;  // the reference's fallback when qkv_hidden_size is null
  if (!vc.contains("qkv_hidden_size") && !k25) c.qkv_hidden_size = 1536;  // K3's default when absent
  // K2.5's attention is as wide as the tower (wqkv [3 * hidden, hidden]).
  MR_RETURN_IF_ERROR(f.positive("qkv_hidden_size", c.qkv_hidden_size));
  MR_RETURN_IF_ERROR(f.number("projector_ln_eps", c.projector_eps));
  c.text_hidden_size = text_hidden_size;
  if (vc.contains("text_hidden_size") && vc["text_hidden_size"] != json(text_hidden_size))
    return failed_precondition(f.where("text_hidden_size") + " is " + vc["text_hidden_size"].dump() +
                               " but the text model's hidden_size is " + std::to_string(text_hidden_size));
  if (vc.contains("mm_hidden_size") && !vc["mm_hidden_size"].is_null() && vc["mm_hidden_size"] != json(c.hidden_size))
    return failed_precondition(f.where("mm_hidden_size") + " must equal vt_hidden_size (" +
                               std::to_string(c.hidden_size) + "): the projector reads the tower's output");
  if (c.qkv_hidden_size % c.num_heads != 0 || c.head_dim() % 4 != 0)
    return failed_precondition(f.where("qkv_hidden_size") + " " + std::to_string(c.qkv_hidden_size) +
                               " must split into vt_num_attention_heads heads of a multiple of 4 (2-D RoPE)");

  // The norms, the biases and the projector: K3's (RMSNorm, none, patchmergerv2) or
  // K2.5's (LayerNorm, all, patchmerger); the flavor gives the absent ones.
  const json norm = vc.contains("norm_type") && !vc["norm_type"].is_null() ? vc["norm_type"]
                                                                           : json(k25 ? "layernorm" : "rmsnorm");
  if (norm == json("layernorm")) c.norm = VisionNorm::kLayerNorm;
  else if (norm != json("rmsnorm"))
    return failed_precondition(f.where("norm_type") + " is " + norm.dump() + "; moonrun runs \"rmsnorm\" (K3) or "
                               "\"layernorm\" (K2.5)");
  c.linear_bias = k25;
  MR_RETURN_IF_ERROR(f.only("attn_bias", json(c.linear_bias), json(c.linear_bias)));
  MR_RETURN_IF_ERROR(f.only("linear_bias", json(c.linear_bias), json(c.linear_bias)));
  MR_RETURN_IF_ERROR(f.only("patch_embed_proj_bias", json(c.linear_bias), json(c.linear_bias)));
  if (k25) c.pos_emb_interpolation = PosEmbInterpolation::kBicubic;  // MoonViT3d's resize
  if (c.norm == VisionNorm::kLayerNorm) c.norm_eps = 1e-5f;          // nn.LayerNorm's default
  MR_RETURN_IF_ERROR(f.only("mlp_type", "mlp2", "mlp2"));
  MR_RETURN_IF_ERROR(f.only("activation_func", "gelu_pytorch_tanh", "gelu_pytorch_tanh"));
  MR_RETURN_IF_ERROR(f.only("pos_emb_type", "divided_fixed", "divided_fixed"));
  if (vc.contains("pos_emb_interpolation_mode") && !vc["pos_emb_interpolation_mode"].is_null()) {
    const json& m = vc["pos_emb_interpolation_mode"];
    if (m == json("bicubic")) c.pos_emb_interpolation = PosEmbInterpolation::kBicubic;
    else if (m != json("bilinear"))
      return failed_precondition(f.where("pos_emb_interpolation_mode") + " is " + m.dump() +
                                 "; moonrun resizes the position table \"bilinear\" (K3's) or \"bicubic\"");
  }
  MR_RETURN_IF_ERROR(f.only("merge_type", "sd2_tpool", "sd2_tpool"));
  const json proj = vc.contains("mm_projector_type") && !vc["mm_projector_type"].is_null()
                        ? vc["mm_projector_type"]
                        : json(k25 ? "patchmerger" : "patchmergerv2");
  if (proj == json("patchmerger")) c.projector = VisionProjector::kPatchMerger;
  else if (proj != json("patchmergerv2"))
    return failed_precondition(f.where("mm_projector_type") + " is " + proj.dump() + "; moonrun runs "
                               "\"patchmergerv2\" (K3) or \"patchmerger\" (K2.5)");
  MR_RETURN_IF_ERROR(f.only("projector_hidden_act", "gelu", "gelu"));

  // The tower's nn.RMSNorm() has no eps. torch's rms_norm then adds the machine epsilon of
  // its op-math type, float32 for a bfloat16, float16 or float32 input (at::rms_norm:
  // toOpMathType, then numeric_limits<float>::epsilon()), not the input dtype's own epsilon
  // that its docs used to state: 2^-23 whichever of the three the checkpoint holds.
  if (dtype_name == "bfloat16" || dtype_name == "float16" || dtype_name == "float32" || dtype_name.empty()) {
    if (c.norm == VisionNorm::kRmsNorm) c.norm_eps = std::numeric_limits<float>::epsilon();
  } else return failed_precondition(source + ": torch_dtype \"" + dtype_name + "\" is not a dtype moonrun knows");
  return c;
}

}  // namespace moonrun
