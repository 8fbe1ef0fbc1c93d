#pragma once
// The ModelRunner of the CPU backend: KimiK3Model::forward over the engine's batch, with
// the KDA slot contents (KdaSlotPool) owned here and the MLA pages the cache manager's.
// make_cpu_engine() puts model, cache, runner and engine loop together the way `moonrun
// serve` needs them, sizing the pools from a memory budget.
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "engine/engine_loop.h"
#include "model/kimi_k3.h"
#include "model/state_pool.h"
#include "runtime/model_runner.h"

namespace moonrun {

// What a token (MLA rows) and a sequence (KDA state) cost in the CPU backend's float32.
CacheLayout cpu_cache_layout(const ModelConfig& cfg);

class CpuModelRunner : public ModelRunner {
 public:
  // mla_pool: the cache manager's view; num_kda_slots: its slot count.
  CpuModelRunner(std::shared_ptr<const KimiK3Model> model, const MlaPoolView& mla_pool, int num_kda_slots);

  // One sequence's KDA state in bytes (cpu_cache_layout(cfg).kda_slot_bytes).
  static int64_t kda_slot_bytes(const ModelConfig& cfg) { return cpu_cache_layout(cfg).kda_slot_bytes; }

  Status forward(const ForwardBatch& batch, std::vector<float>& logits) override;
  int vocab() const override { return model_->config().vocab_size; }
  void reset_kda_slot(int slot) override { kda_slots_.reset(slot); }
  // Fault injection for the server's failure tests: forward fails after this many steps.
  void fail_after_steps(int64_t steps) { fail_after_steps_ = steps; }

 private:
  std::shared_ptr<const KimiK3Model> model_;
  MlaPoolView mla_pool_;
  KdaSlotPool kda_slots_;
  int64_t fail_after_steps_ = -1;  // < 0: never
  int64_t steps_ = 0;
};

// What `serve` asks of an engine, whichever backend runs it.
struct EngineOptions {
  int max_running_requests = 16;
  int chunked_prefill_size = 2048;   // token budget per step
  int max_queued_requests = -1;
  int context_length = 0;            // 0: the model's max_position_embeddings, capped by the pool
  int page_size_tokens = 16;
  int64_t cache_budget_bytes = int64_t{1} << 30;  // MLA pages + KDA slots (CPU; CUDA sizes from its arena)
  int64_t max_total_tokens = 0;      // > 0: cap the pool at this many tokens
  std::vector<int32_t> eos_token_ids;  // empty: config.json's eos_token_id
  uint64_t seed = 0;
  std::function<bool(int32_t)> is_special_token;  // EngineConfig::is_special_token
  int64_t fail_after_steps = -1;     // >= 0: the backend fails after this many steps (tests)
};

// The engine's limits from the options, the model and the sized cache (both backends):
// max_model_len = --context-length, else the model's capped by the pool; EOS ids from the
// options or config.json. Checked with check_engine_config.
Result<EngineConfig> engine_config_for(const ModelConfig& cfg, const EngineOptions& options,
                                       const CacheConfig& cache_config);
// Logs the pool sizes and limits as the seed's server does.
void log_cache_pools(const CacheConfig& cache_config, const EngineOptions& options, const EngineConfig& config,
                     const char* row_dtype);

// Sizes the cache (KDA slots = max_running_requests, the rest MLA pages), builds the runner
// and the engine loop (not started). Logs the pool sizes as the seed's server does.
Result<std::unique_ptr<EngineLoop>> make_cpu_engine(std::shared_ptr<const KimiK3Model> model,
                                                    const EngineOptions& options, DetokenizeFn detokenize);

}  // namespace moonrun
