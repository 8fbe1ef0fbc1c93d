#pragma once
// Weights described once (K3_SPEC.md §1). A model lists its tensors in one function
// (describe_kimi_k3_weights in model/kimi_k3.cpp) against a WeightSink; the same listing
//   - with the loader's sink (model/loader.h) reads each tensor's bytes for (rank, world)
//     straight into the backend's layout,
//   - with a collecting sink gives weight_spec(): name, stored dtype and shape, shard rule,
//     for `verify`, `plan` and the demo-model writer.
// So a tensor name, its shape and how it splits across ranks are spelled in one place.
#include <cstdint>
#include <string>
#include <vector>

#include "backend/tensor.h"
#include "common/dtype.h"
#include "common/status.h"
#include "model/config.h"
#include "model/pipeline.h"

namespace moonrun {

// How one rank's listing lays the weights out beyond the default shard rules: the pipeline
// stage it holds, and two groups every rank holds whole unless split (issue 41: at TP 8 they
// are 4.1 GB (LatentMoE) + 0.5 GB (router) of what each GPU reads a K3 step).
struct WeightLayout {
  StageLayers stage;
  // The fp32 MoE router column-split by expert; its logits all-gathered for the top-k.
  bool split_router = false;
  // The LatentMoE down projection column-split (its output all-gathered for the experts);
  // with split_latent_up also the up projection row-split (its partial sum joins the shared
  // experts' all-reduce; the routed sum then needs an all-reduce of its own before the latent
  // norm). Whole, the up projection runs on the reduced routed sum, which rides the shared
  // experts' all-reduce (model/layers/moe.cpp): one collective fewer a MoE layer.
  bool split_latent_moe = false;
  bool split_latent_up = false;
};

// How a tensor splits over the ranks of a tensor- and expert-parallel group.
enum class ShardRule {
  replicated,  // every rank holds it (norms, router, low-rank down projections)
  column,      // split along the output dim (dim 0): heads, MLP intermediate
  row,         // split along the input dim (dim 1): o_proj, down_proj; an all-reduce follows
  expert,      // routed experts: whole experts per rank
  vocab,       // embeddings and lm_head: rows of the vocabulary
};
const char* shard_rule_name(ShardRule rule);

// One checkpoint tensor as the model expects it.
struct TensorSpec {
  std::string name;
  DType dtype;                 // as the release stores it
  std::vector<int64_t> shape;  // as the release stores it
  ShardRule shard = ShardRule::replicated;
  int expert = -1;  // a routed expert's tensor: its expert id
  int64_t numel() const;
  uint64_t nbytes() const;
};

// Where a rank stands in a tensor/expert-parallel group, SGLang's layout: `world` ranks
// split heads, dense intermediates and the vocabulary; the routed experts go to `ep`
// groups of world/ep ranks, every rank of a group holding the group's experts with each
// expert's intermediate dimension split among them.
struct ParallelRank {
  int rank = 0;
  int world = 1;
  int ep = 1;
  // DP attention (SGLang --enable-dp-attention): every rank holds everything but the routed
  // experts whole (attention, dense and shared MLPs, vocabulary); the experts split as above.
  bool dp_attention = false;
  int moe_tp() const { return world / ep; }  // ranks sharing one expert
  int ep_rank() const { return rank / moe_tp(); }
  int moe_tp_rank() const { return rank % moe_tp(); }
};

// The block [r0, r1) x [c0, c1) of a stored [rows, cols] tensor a rank holds under a dense
// rule: column and vocab split the rows (a [1, n] vector its n), row the columns. An
// extent that does not divide is an error naming the tensor. The loader reads exactly this.
struct ShardBlock {
  int64_t r0 = 0, r1 = 0, c0 = 0, c1 = 0;
};
Result<ShardBlock> dense_shard(const std::string& name, ShardRule rule, int64_t rows, int64_t cols,
                               const ParallelRank& p);

// The bytes of a listed tensor one rank reads (0 for another expert group's experts), and
// their sum over the model: what `plan` reports per GPU and the loader places.
uint64_t rank_tensor_bytes(const TensorSpec& t, const ParallelRank& p, int num_experts);
uint64_t rank_weight_bytes(const ModelConfig& cfg, const ParallelRank& p);

// Which matrix of a routed expert: w1 (gate), w3 (up) [intermediate, io], w2 (down) [io, intermediate].
enum class ExpertMatrix { w1, w2, w3 };

// Full tensor names, built from the config's prefix ("language_model.model." or "model.").
class TensorNames {
 public:
  explicit TensorNames(const ModelConfig& cfg);
  std::string global(const std::string& suffix) const { return prefix_ + suffix; }  // "norm.weight"
  std::string layer(int layer, const std::string& suffix) const {
    return prefix_ + "layers." + std::to_string(layer) + "." + suffix;
  }
  // "<layer>.block_sparse_moe.experts.<e>.w1." + part ("weight", "weight_packed", ...); the
  // K2 family's "<layer>.mlp.experts.<e>.gate_proj." (w1), down_proj (w2), up_proj (w3).
  std::string expert(int layer, int expert, ExpertMatrix m, const std::string& part) const;
  const std::string& lm_head() const { return lm_head_; }

 private:
  std::string prefix_;
  std::string lm_head_;
  bool deepseek_ = false;
};

// The tensor parts storing one routed-expert matrix under the config's quantization:
// {"weight"} (bf16), {"weight_packed", "weight_scale"} (compressed-tensors MXFP4),
// {"weight_blocks", "weight_scales"} (gpt-oss MXFP4) or {"weight_packed", "weight_scale",
// "weight_shape"} (compressed-tensors INT4 pack-quantized).
std::vector<std::string> expert_parts(ExpertQuant quant);

// What a model's weight listing calls, one call per tensor (or per expert stack).
class WeightSink {
 public:
  virtual ~WeightSink() = default;
  // A dense projection stored [out, in] (BF16 in the release), held as a Matrix in the
  // backend's weight dtype.
  virtual void matrix(Matrix& dst, const std::string& name, int out, int in, ShardRule rule) = 0;
  // A small tensor every backend keeps in F32 (norm and conv weights, A_log, biases),
  // stored as `stored` x `shape` and held as [rows, cols] (rows * cols elements).
  virtual void f32(Tensor& dst, const std::string& name, DType stored, const std::vector<int64_t>& shape,
                   int64_t rows, int64_t cols, ShardRule rule) = 0;
  // One kind of routed-expert matrix [out, in] for all experts of a layer, stacked: MXFP4
  // codes + scales as stored, or dense in the weight dtype (bf16 experts).
  virtual void experts(ExpertMatrices& dst, int layer, ExpertMatrix which, int num_experts, int out, int in) = 0;
};

// Every text-model tensor in the release's dtypes, from the family's listing (families.h):
// A_log, dt_bias, the KDA conv weights [D, 1, K], o_norm and the router's
// e_score_correction_bias in F32; MXFP4 experts as U8 weight_packed [out, in/2] +
// weight_scale [out, in/32] (gpt-oss: blocks [out, in/32, 16] + scales [out, in/32]); INT4
// experts as I32 weight_packed [out, in/8] + BF16 weight_scale [out, in/32] + I64
// weight_shape [2]; everything else BF16. With a vision tower (config.vision.enabled),
// its vision_tower.* and mm_projector.* tensors (BF16) follow the text model's.
std::vector<TensorSpec> weight_spec(const ModelConfig& cfg);

// Stored shapes the reference loader also accepts for a tensor (beyond the expected one):
// A_log is [H] in K3 and [1, 1, H, 1] in Kimi Linear; either is read as [H].
bool is_alternative_shape(const TensorSpec& t, const std::vector<int64_t>& stored);

}  // namespace moonrun
