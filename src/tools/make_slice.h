#pragma once
// `moonrun make-slice`: a real K3-layout checkpoint of a few layers at full width, from a
// published config.json, for benchmarks and for load tests of multi-GB checkpoints. The
// layers are listed by kind ("kda-dense,kda-moe,mla-moe": attention kind - MLP kind; dense
// layers come first, as first_k_dense_replace has them); every tensor the weight spec lists
// is written (MXFP4 routed experts, bf16 elsewhere, fp32 where the release is fp32) with
// synthetic values (model/synthetic_weights.h) generated on all cores and streamed to
// safetensors shards behind an index, so a 30 GB slice takes about as long as the disk.
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace moonrun::tools {

struct SliceConfig {
  std::string config_path;           // a config.json (K3's nested text_config, Kimi Linear's flat one,
                                     // K3.1's, K2's DeepSeek-V3 layout), or "kimi-k3": the published K3
                                     // config built into moonrun
  std::vector<std::string> layers;   // "kda-dense", "kda-moe", "mla-dense", "mla-moe" (K2: mla only)
  std::string out_dir;
  int num_experts = 0;               // > 0: fewer routed experts than the config's (top-k stays)
  uint64_t seed = 1;
  uint64_t shard_bytes = uint64_t{5} << 30;
  int threads = 0;                   // 0: every core
};

struct SliceReport {
  uint64_t bytes = 0;
  int tensors = 0, shards = 0;
  double seconds = 0;
};

Result<SliceReport> make_slice(const SliceConfig& config);

}  // namespace moonrun::tools
