#include "runtime/cpu_model_runner.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "common/log.h"

namespace moonrun {

CacheLayout cpu_cache_layout(const ModelConfig& cfg) {
  CacheLayout layout;
  layout.num_mla_layers = cfg.num_mla_layers;
  layout.row_floats = cfg.mla_cache_row();
  layout.dtype_bytes = static_cast<int>(sizeof(float));
  // Per KDA layer: the q/k/v conv windows [conv_kernel - 1, H*d] each and S [H, d, d].
  const int64_t proj = static_cast<int64_t>(cfg.kda_num_heads) * cfg.kda_head_dim;
  const int64_t conv_floats = 3 * static_cast<int64_t>(std::max(cfg.kda_conv_kernel - 1, 0)) * proj;
  const int64_t s_floats = proj * cfg.kda_head_dim;
  layout.kda_slot_bytes = cfg.num_kda_layers * (conv_floats + s_floats) * static_cast<int64_t>(sizeof(float));
  return layout;
}

CpuModelRunner::CpuModelRunner(std::shared_ptr<const KimiK3Model> model, const MlaPoolView& mla_pool,
                               int num_kda_slots)
    : model_(std::move(model)), mla_pool_(mla_pool), kda_slots_(model_->config(), num_kda_slots) {}

Status CpuModelRunner::forward(const ForwardBatch& batch, std::vector<float>& logits) {
  if (fail_after_steps_ >= 0 && steps_++ >= fail_after_steps_)
    return internal_error("injected backend failure after " + std::to_string(fail_after_steps_) +
                          " steps (--debug-fail-after-steps)");
  logits.resize(static_cast<size_t>(batch.n_logit_rows()) * vocab());
  return model_->forward(batch, kda_slots_, mla_pool_, logits.data());
}

Result<EngineConfig> engine_config_for(const ModelConfig& cfg, const EngineOptions& options,
                                       const CacheConfig& cache_config) {
  EngineConfig config;
  config.scheduler.max_running_requests = options.max_running_requests;
  config.scheduler.max_tokens_per_step = options.chunked_prefill_size;
  config.scheduler.max_queued_requests = options.max_queued_requests;
  const int64_t pool_tokens = cache_config.total_tokens();
  if (options.context_length > 0) {
    config.max_model_len = options.context_length;  // as asked; requests beyond the pool wait or fail
  } else {
    const int64_t model_len = cfg.max_position_embeddings > 0 ? cfg.max_position_embeddings : pool_tokens;
    config.max_model_len = static_cast<int>(std::min<int64_t>(model_len, pool_tokens));
  }
  config.eos_token_ids = options.eos_token_ids;
  if (config.eos_token_ids.empty() && cfg.eos_token_id >= 0) config.eos_token_ids.push_back(cfg.eos_token_id);
  config.seed = options.seed;
  config.is_special_token = options.is_special_token;
  MR_RETURN_IF_ERROR(check_engine_config(config, cache_config));
  return config;
}

void log_cache_pools(const CacheConfig& cache_config, const EngineOptions& options, const EngineConfig& config,
                     const char* row_dtype) {
  // SGLang's line, which the seed's users read: dtype, #tokens, KV size; then our detail.
  char kv_gb[32];
  std::snprintf(kv_gb, sizeof kv_gb, "%.2f", cache_config.mla_bytes() / 1e9);
  MR_LOG(INFO) << "KV Cache is allocated. dtype: " << row_dtype << ", #tokens: " << cache_config.total_tokens()
               << ", KV size: " << kv_gb << " GB (" << cache_config.num_pages << " pages x "
               << cache_config.page_size_tokens << " tokens, " << cache_config.layout.bytes_per_token()
               << " bytes/token); KDA state: " << cache_config.num_kda_slots << " slots x "
               << cache_config.layout.kda_slot_bytes << " bytes (" << cache_config.kda_bytes() / (1 << 20) << " MiB)";
  MR_LOG(INFO) << "max_total_num_tokens=" << cache_config.total_tokens()
               << ", chunked_prefill_size=" << options.chunked_prefill_size
               << ", max_running_requests=" << options.max_running_requests << ", context_len=" << config.max_model_len;
}

Result<std::unique_ptr<EngineLoop>> make_cpu_engine(std::shared_ptr<const KimiK3Model> model,
                                                    const EngineOptions& options, DetokenizeFn detokenize) {
  if (!model) return invalid_argument("make_cpu_engine: no model");
  const ModelConfig& cfg = model->config();
  if (options.max_running_requests < 1)
    return invalid_argument("--max-running-requests must be >= 1, got " + std::to_string(options.max_running_requests));
  const CacheLayout layout = cpu_cache_layout(cfg);
  CacheConfig cache_config = MR_TRY(size_cache_from_budget(layout, options.cache_budget_bytes, options.page_size_tokens,
                                                           options.max_running_requests, options.max_total_tokens));

  const EngineConfig config = MR_TRY(engine_config_for(cfg, options, cache_config));
  log_cache_pools(cache_config, options, config, "float32");
  auto cache = std::make_unique<CacheManager>(cache_config);
  auto runner = std::make_unique<CpuModelRunner>(model, cache->mla_view(), cache_config.num_kda_slots);
  runner->fail_after_steps(options.fail_after_steps);
  return EngineLoop::create(config, std::move(cache), std::move(runner), std::move(detokenize));
}

}  // namespace moonrun
