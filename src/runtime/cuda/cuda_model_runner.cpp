#include "runtime/cuda/cuda_model_runner.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>

#include "common/log.h"
#include "kernels/cuda/common/cuda_check.h"
#include "model/layer_dims.h"

namespace moonrun {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// Temporaries one step of `tokens` new tokens may take, generously: the logits rows, the
// residual stream and AttnRes blocks, the widest layer's activations (KDA's projections or
// the routed experts' per-choice rows), and the MLA prefill's per-head expansion of up to
// kMlaExpandTokens cached positions. Long-context prefill beyond that needs the flash-MLA
// kernel of the speed issue; until then such a step fails with "device arena full".
int64_t scratch_reserve_bytes(const ModelConfig& c, int tokens) {
  constexpr int64_t kMlaExpandTokens = 32768;
  const int64_t H = c.hidden_size;
  const int64_t blocks = c.attn_res_block_size > 0 ? (c.num_hidden_layers + c.attn_res_block_size - 1) / c.attn_res_block_size : 0;
  const int64_t stream = (8 + blocks) * H * 4;
  const int64_t kda = 16 * static_cast<int64_t>(c.kda_proj_dim()) * 4;
  const int64_t experts = static_cast<int64_t>(std::max(c.num_experts_per_token, 1)) *
                          (4 * std::max(c.moe_intermediate_size, 1) + 2 * c.expert_io_dim()) * 4;
  const int64_t shared = 4 * static_cast<int64_t>(std::max(c.intermediate_size, c.shared_intermediate_size())) * 4;
  const int64_t mla_q = 4 * static_cast<int64_t>(c.num_attention_heads) * (c.mla_q_head_dim() + c.v_head_dim) * 4;
  const int64_t per_token = static_cast<int64_t>(c.vocab_size) * 4 + stream +
                            std::max({kda, experts + shared, mla_q}) + 2 * H * 4;
  const int64_t mla_expand = c.num_mla_layers > 0
                                 ? kMlaExpandTokens * c.num_attention_heads * (c.qk_nope_head_dim + c.v_head_dim) * 4 * 2
                                 : 0;
  return per_token * std::max(tokens, 1) + mla_expand + (int64_t{256} << 20);
}

}  // namespace

CacheLayout cuda_cache_layout(const ModelConfig& cfg) {
  CacheLayout layout = cpu_cache_layout(cfg);  // KDA state is fp32 on both backends
  layout.dtype_bytes = 2;                      // bf16 latent rows
  return layout;
}

Result<std::unique_ptr<CudaModelRunner>> CudaModelRunner::create(const KimiK3Model& host,
                                                                 const CudaDeviceOptions& options) {
  int n_devices = 0;
  if (cudaGetDeviceCount(&n_devices) != cudaSuccess || n_devices == 0) {
    (void)cudaGetLastError();
    return failed_precondition("--device cuda: no CUDA device is visible (driver missing or no GPU); use --device cpu");
  }
  if (options.device < 0 || options.device >= n_devices)
    return invalid_argument("CUDA device " + std::to_string(options.device) + " does not exist (" +
                            std::to_string(n_devices) + " visible)");
  if (!(options.mem_fraction_static > 0 && options.mem_fraction_static < 1))
    return invalid_argument("--mem-fraction-static must be in (0, 1), got " +
                            std::to_string(options.mem_fraction_static));
  std::unique_ptr<CudaModelRunner> r(new CudaModelRunner());
  try {
    CUDA_CHECK(cudaSetDevice(options.device));
    cudaDeviceProp prop{};
    CUDA_CHECK(cudaGetDeviceProperties(&prop, options.device));
    size_t free_bytes = 0, total_bytes = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    r->memory_.device_name = prop.name;
    r->memory_.total_gb = total_bytes / kGiB;
    r->memory_.free_before_gb = free_bytes / kGiB;
    // SGLang's meaning: the static pools (weights + KV) take this fraction of the card. What
    // other processes hold is not ours to take, so the arena also stays under what is free.
    const size_t want = static_cast<size_t>(options.mem_fraction_static * static_cast<double>(total_bytes));
    const size_t headroom = size_t{512} << 20;  // cuBLAS workspaces, CUDA context growth
    const size_t arena_bytes = std::min(want, free_bytes > headroom ? free_bytes - headroom : 0);
    if (arena_bytes == 0) return resource_exhausted("no free memory on CUDA device " + std::to_string(options.device));
    r->arena_ = std::make_unique<cuda::DeviceArena>(arena_bytes);
    r->memory_.arena_gb = arena_bytes / kGiB;
    CUDA_CHECK(cudaStreamCreateWithFlags(&r->stream_, cudaStreamNonBlocking));
    r->model_ = std::make_unique<cuda::CudaKimiK3Model>(host, *r->arena_, r->stream_);
    CUDA_CHECK(cudaStreamSynchronize(r->stream_));
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    r->memory_.free_after_weights_gb = free_bytes / kGiB;
    r->memory_.weights_gb = r->model_->weight_bytes() / kGiB;
    r->scratch_reserve_bytes_ = scratch_reserve_bytes(host.config(), options.max_tokens_per_step);
    r->memory_.scratch_reserve_gb = r->scratch_reserve_bytes_ / kGiB;
  } catch (const cuda::CudaError& e) {
    return resource_exhausted(std::string("loading the model onto the GPU failed: ") + e.what());
  }
  return r;
}

CudaModelRunner::~CudaModelRunner() {
  if (stream_) {
    cudaStreamSynchronize(stream_);
    model_.reset();  // its cuBLASLt handle belongs to the stream
    cudaStreamDestroy(stream_);
  }
}

int64_t CudaModelRunner::cache_budget_bytes() const {
  return std::max<int64_t>(0, static_cast<int64_t>(arena_->available()) - scratch_reserve_bytes_);
}

Status CudaModelRunner::allocate_pools(const CacheConfig& cache) {
  const ModelConfig& cfg = model_->config();
  try {
    pools_.num_kda_slots = cache.num_kda_slots;
    pools_.num_pages = cache.num_pages;
    pools_.page_size_tokens = cache.page_size_tokens;
    const int64_t kda_floats = model_->kda_slot_floats() * cache.num_kda_slots;
    if (kda_floats > 0) {
      pools_.kda = arena_->alloc<float>(kda_floats, "KDA state slots");
      CUDA_CHECK(cudaMemsetAsync(pools_.kda, 0, kda_floats * sizeof(float), stream_));
    }
    const int64_t mla_values = static_cast<int64_t>(cfg.num_mla_layers) * cache.num_pages * cache.page_size_tokens *
                               cfg.mla_cache_row();
    if (mla_values > 0) pools_.mla = arena_->alloc<cuda::bf16>(mla_values, "MLA latent pages");
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  } catch (const cuda::CudaError& e) {
    return resource_exhausted(std::string("allocating the cache pools failed: ") + e.what());
  }
  return Status::ok();
}

void CudaModelRunner::reset_kda_slot(int slot) {
  try {
    model_->reset_kda_slot(pools_, slot);
  } catch (const cuda::CudaError& e) {
    if (failed_.is_ok()) failed_ = internal_error(e.what());
  }
}

Status CudaModelRunner::forward(const ForwardBatch& batch, std::vector<float>& logits) {
  if (!failed_.is_ok()) return failed_;
  if (fail_after_steps_ >= 0 && steps_++ >= fail_after_steps_)
    return internal_error("injected backend failure after " + std::to_string(fail_after_steps_) +
                          " steps (--debug-fail-after-steps)");
  logits.resize(static_cast<size_t>(batch.n_logit_rows()) * vocab());
  try {
    return model_->forward(batch, pools_, *arena_, logits.data());
  } catch (const cuda::CudaError& e) {
    // A CUDA error leaves the context in an unknown state: every later step fails too.
    failed_ = internal_error(std::string("CUDA backend failure: ") + e.what());
    return failed_;
  }
}

Result<std::unique_ptr<EngineLoop>> make_cuda_engine(std::unique_ptr<CudaModelRunner> runner,
                                                     const EngineOptions& options, DetokenizeFn detokenize) {
  if (!runner) return invalid_argument("make_cuda_engine: no runner");
  const ModelConfig& cfg = runner->config();
  if (options.max_running_requests < 1)
    return invalid_argument("--max-running-requests must be >= 1, got " + std::to_string(options.max_running_requests));
  const CacheLayout layout = cuda_cache_layout(cfg);
  CacheConfig cache_config = MR_TRY(size_cache_from_budget(layout, runner->cache_budget_bytes(), options.page_size_tokens,
                                                           options.max_running_requests, options.max_total_tokens));
  cache_config.host_rows = false;
  MR_RETURN_IF_ERROR(runner->allocate_pools(cache_config));

  const EngineConfig config = MR_TRY(engine_config_for(cfg, options, cache_config));
  log_cache_pools(cache_config, options, config, "bfloat16");
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
    char gb[32];
    std::snprintf(gb, sizeof gb, "%.2f", free_bytes / kGiB);
    MR_LOG(INFO) << "Memory pool end. avail mem=" << gb << " GB (outside the arena)";
  }
  runner->fail_after_steps(options.fail_after_steps);
  auto cache = std::make_unique<CacheManager>(cache_config);
  return EngineLoop::create(config, std::move(cache), std::move(runner), std::move(detokenize));
}

Result<GenerateResult> generate_cuda(const KimiK3Model& host, const std::vector<int32_t>& prompt,
                                     const GenerateOptions& opt, const CudaDeviceOptions& device) {
  constexpr int kPageSize = 64;
  CudaDeviceOptions dev = device;
  dev.max_tokens_per_step = std::max<int>(dev.max_tokens_per_step, static_cast<int>(prompt.size()));
  auto runner = MR_TRY(CudaModelRunner::create(host, dev));
  CacheConfig cache;
  cache.layout = cuda_cache_layout(host.config());
  cache.page_size_tokens = kPageSize;
  cache.num_pages = std::max(1, generate_pages_needed(prompt.size(), opt, kPageSize));
  cache.num_kda_slots = 1;
  cache.host_rows = false;
  MR_RETURN_IF_ERROR(runner->allocate_pools(cache));
  std::vector<float> row;
  auto forward = [&](const ForwardBatch& batch, float* logits) -> Status {
    MR_RETURN_IF_ERROR(runner->forward(batch, row));
    std::copy(row.begin(), row.end(), logits);
    return Status::ok();
  };
  return generate_with(forward, host.config().vocab_size, kPageSize, prompt, opt);
}

}  // namespace moonrun
