#pragma once
// The one table of checkpoint tensor names (K3_SPEC.md §1): what a Kimi K3 / Kimi Linear
// text model stores, with the release's dtypes and shapes. The loader, `verify` and `plan`
// all read it, so a name is spelled in exactly one place.
#include <cstdint>
#include <string>
#include <vector>

#include "model/checkpoint.h"
#include "model/config.h"

namespace moonrun {

struct ExpectedTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  int64_t numel() const;
  uint64_t nbytes() const;
};

// Which matrix of a routed expert: w1 (gate), w3 (up) [intermediate, io], w2 (down) [io, intermediate].
enum class ExpertMatrix { w1, w2, w3 };

// Full tensor names, built from the config's prefix ("language_model.model." or "model.").
class TensorNames {
 public:
  explicit TensorNames(const ModelConfig& cfg) : prefix_(cfg.tensor_prefix), lm_head_(cfg.lm_head_name) {}
  std::string global(const std::string& suffix) const { return prefix_ + suffix; }  // "norm.weight"
  std::string layer(int layer, const std::string& suffix) const {
    return prefix_ + "layers." + std::to_string(layer) + "." + suffix;
  }
  // "<layer>.block_sparse_moe.experts.<e>.w1." + part ("weight", "weight_packed", ...).
  std::string expert(int layer, int expert, ExpertMatrix m, const std::string& part) const;
  const std::string& lm_head() const { return lm_head_; }

 private:
  std::string prefix_;
  std::string lm_head_;
};

// The tensor parts storing one routed-expert matrix under the config's quantization:
// {"weight"} (bf16), {"weight_packed", "weight_scale"} (compressed-tensors MXFP4) or
// {"weight_blocks", "weight_scales"} (gpt-oss MXFP4).
std::vector<std::string> expert_parts(ExpertQuant quant);

// Every text-model tensor in the release's dtypes: A_log, dt_bias, the KDA conv weights
// [D, 1, K], o_norm and the router's e_score_correction_bias in F32; MXFP4 experts as U8
// weight_packed [out, in/2] + weight_scale [out, in/32] (gpt-oss: blocks [out, in/32, 16] +
// scales [out, in/32]); everything else BF16. Vision tower tensors are not listed.
std::vector<ExpectedTensor> expected_tensors(const ModelConfig& cfg);

// Stored shapes the reference loader also accepts for a tensor (beyond the expected one):
// A_log is [H] in K3 and [1, 1, H, 1] in Kimi Linear; either is read as [H].
bool is_alternative_shape(const ExpectedTensor& t, const std::vector<int64_t>& stored);

}  // namespace moonrun
