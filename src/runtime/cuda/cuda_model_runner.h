#pragma once
// The ModelRunner of the CUDA backend (one GPU): the model's weights, the KDA state slots and
// the paged bf16 MLA latent pool all live in one device arena of
// --mem-fraction-static x total GPU memory; per-step temporaries come from the arena's tail.
// The engine, scheduler, cache accounting and sampler are the CPU backend's, unchanged
// (CacheManager with host_rows = false only counts pages; the rows are here).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cache/cache_manager.h"
#include "engine/engine_loop.h"
#include "kernels/cuda/common/device_buffer.h"
#include "model/cuda/kimi_k3_cuda.h"
#include "model/generate.h"
#include "model/kimi_k3.h"
#include "runtime/cpu_model_runner.h"
#include "runtime/model_runner.h"

namespace moonrun {

// What a token (bf16 MLA rows) and a sequence (fp32 KDA state) cost on the GPU.
CacheLayout cuda_cache_layout(const ModelConfig& cfg);

struct CudaDeviceOptions {
  int device = 0;
  double mem_fraction_static = 0.88;  // of total device memory: weights + caches + scratch
  int max_tokens_per_step = 2048;     // sizes the scratch reserve (the chunked prefill budget)
};

struct CudaMemoryReport {
  std::string device_name;
  double total_gb = 0, free_before_gb = 0, free_after_weights_gb = 0;
  double arena_gb = 0, weights_gb = 0, scratch_reserve_gb = 0;
};

class CudaModelRunner : public ModelRunner {
 public:
  // Selects the device, reserves the arena and uploads the weights of `host` (which may be
  // dropped afterwards). Errors (no device, not enough memory) come back as a Status.
  static Result<std::unique_ptr<CudaModelRunner>> create(const KimiK3Model& host, const CudaDeviceOptions& options);
  ~CudaModelRunner() override;

  const ModelConfig& config() const { return model_->config(); }
  const CudaMemoryReport& memory() const { return memory_; }
  // Bytes left for the KDA slots and MLA pages once the scratch reserve is set aside.
  int64_t cache_budget_bytes() const;
  // Carves the pools for `cache` (page geometry and slot count) out of the arena.
  Status allocate_pools(const CacheConfig& cache);

  Status forward(const ForwardBatch& batch, std::vector<float>& logits) override;
  int vocab() const override { return model_->config().vocab_size; }
  void reset_kda_slot(int slot) override;
  void fail_after_steps(int64_t steps) { fail_after_steps_ = steps; }
  cuda::CudaKimiK3Model& model() { return *model_; }

 private:
  CudaModelRunner() = default;
  std::unique_ptr<cuda::DeviceArena> arena_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<cuda::CudaKimiK3Model> model_;
  cuda::DeviceStatePools pools_;
  CudaMemoryReport memory_;
  int64_t scratch_reserve_bytes_ = 0;
  Status failed_ = Status::ok();  // a CUDA error outside forward() (reset_kda_slot), reported by the next forward
  int64_t fail_after_steps_ = -1;
  int64_t steps_ = 0;
};

// As make_cpu_engine, on the GPU: sizes the pools from what the arena has left, builds the
// runner's pools and the engine loop (not started). Logs the pool sizes.
Result<std::unique_ptr<EngineLoop>> make_cuda_engine(std::unique_ptr<CudaModelRunner> runner,
                                                     const EngineOptions& options, DetokenizeFn detokenize);

}  // namespace moonrun

namespace moonrun {

// `moonrun generate` on the GPU: one sequence through a runner with one KDA slot and just
// enough pages (generate_with's page layout, 64 tokens a page).
Result<GenerateResult> generate_cuda(const KimiK3Model& host, const std::vector<int32_t>& prompt,
                                     const GenerateOptions& opt, const CudaDeviceOptions& device);

}  // namespace moonrun
