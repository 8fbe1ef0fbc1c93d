#pragma once
// The weight loader: a WeightSink (weight_spec.h) that reads each tensor the model lists
// from the checkpoint's safetensors files and writes it into the backend's layout for this
// rank: dense projections in the backend's weight dtype (bf16 stays bf16 on a bf16 GPU,
// becomes f32 on the CPU), small tensors in F32, MXFP4 experts as their packed codes and
// scales, stacked per layer. Bytes move through one bounded host staging buffer (pread,
// no mmap of the tensors): the host never holds more than that, whatever the model's size.
// Each rank reads only the byte ranges of its shard (LoadOptions: rank of world_size).
#include <cstdint>
#include <string>

#include "backend/ops.h"
#include "common/status.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/model.h"
#include "model/weight_spec.h"

namespace moonrun {

struct LoadStats {
  uint64_t bytes_read = 0;      // from the checkpoint files
  uint64_t bytes_on_backend = 0;
  double seconds = 0;
  size_t staging_bytes = 0;     // the host staging buffer's size
};

// The byte-range sink. Errors are kept (the first one) and returned by finish().
class WeightLoader final : public WeightSink {
 public:
  WeightLoader(Ops& ops, const Checkpoint& ckpt, const ModelConfig& cfg, const LoadOptions& options);
  ~WeightLoader() override;

  void matrix(Matrix& dst, const std::string& name, int out, int in, ShardRule rule) override;
  void f32(Tensor& dst, const std::string& name, DType stored, const std::vector<int64_t>& shape, int64_t rows,
           int64_t cols, ShardRule rule) override;
  void experts(ExpertMatrices& dst, int layer, ExpertMatrix which, int num_experts, int out, int in) override;

  // The first error, or ok; the load statistics.
  Status finish();
  const LoadStats& stats() const { return stats_; }

  // Bytes this rank will read (for the progress lines' ETA).
  void set_total_bytes(uint64_t bytes);

 private:
  struct Impl;
  Impl* impl_;
  LoadStats stats_;
};

}  // namespace moonrun
