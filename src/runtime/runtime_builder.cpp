#include "runtime/runtime_builder.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/thread_comm.h"
#include "common/host_memory.h"
#include "common/log.h"
#include "model/checkpoint.h"
#include "model/model.h"
#include "runtime/parallel_runner.h"
#if MOONRUN_HAS_CUDA
#include "backend/cuda/cuda_ops.h"
#endif

namespace moonrun {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string fmt2(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The KV cache's element type: the compute dtype unless a supported one is asked for.
Result<DType> kv_dtype_for(const std::string& asked, DType act) {
  if (asked == "auto") return act;
  if (asked == "bf16" || asked == "bfloat16") {
    if (act == DType::BF16) return DType::BF16;
    return invalid_argument("--kv-cache-dtype " + asked + ": this backend computes in float32 and keeps the KV cache "
                            "in float32 (use --kv-cache-dtype auto)");
  }
  if (asked == "float32" || asked == "fp32") {
    if (act == DType::F32) return DType::F32;
    return invalid_argument("--kv-cache-dtype " + asked + " needs --dtype float32");
  }
  if (asked.rfind("fp8", 0) == 0)
    return invalid_argument("--kv-cache-dtype " + asked +
                            " is not implemented yet: moonrun has no fp8 MLA cache; drop the flag (the cache is "
                            "kept in the compute dtype, bf16 on a GPU)");
  return invalid_argument("--kv-cache-dtype must be auto, bfloat16, float32 or fp8_e4m3, got \"" + asked + "\"");
}

Result<std::unique_ptr<Ops>> make_ops(const std::string& device, const RuntimeOptions& o,
                                      std::unique_ptr<Communicator> comm = nullptr) {
  if (o.dtype == "half" || o.dtype == "float16")
    return invalid_argument("--dtype " + o.dtype + " is not supported: moonrun computes in bfloat16 on a GPU and "
                            "float32 on the CPU (use --dtype auto)");
  if (o.dtype != "auto" && o.dtype != "float32" && o.dtype != "bfloat16" && o.dtype != "bf16")
    return invalid_argument("--dtype must be auto, bfloat16 or float32, got \"" + o.dtype + "\"");
  if (device == "cpu") {
    if (o.dtype == "bfloat16" || o.dtype == "bf16")
      return invalid_argument("--dtype " + o.dtype + ": the CPU backend is the float32 reference (use --dtype auto)");
    return std::unique_ptr<Ops>(new cpu::CpuOps(std::move(comm)));
  }
#if MOONRUN_HAS_CUDA
  cuda::CudaOpsOptions co;
  co.device = o.cuda_device;
  co.mem_fraction_static = o.mem_fraction_static > 0 ? o.mem_fraction_static : defaults::kCudaMemFractionStatic;
  co.float32 = o.dtype == "float32";
  return cuda::make_cuda_ops(co);
#else
  return failed_precondition("--device cuda: this build has no CUDA backend");
#endif
}

}  // namespace

std::string resolve_device(const std::string& requested) {
#if MOONRUN_HAS_CUDA
  const bool gpu = cuda::device_count() > 0;
  if (requested == "auto") return gpu ? "cuda" : "cpu";
  if (requested == "cuda" && !gpu) return "error: --device cuda: no CUDA device is visible; use --device cpu";
  return requested;
#else
  if (requested == "cuda")
    return "error: --device cuda: this build has no CUDA backend (nvcc was not found at configure time)";
  return "cpu";
#endif
}

bool has_cuda_backend() {
#if MOONRUN_HAS_CUDA
  return true;
#else
  return false;
#endif
}

std::vector<GpuDescription> visible_gpus() {
  std::vector<GpuDescription> out;
#if MOONRUN_HAS_CUDA
  for (int i = 0, n = cuda::device_count(); i < n; ++i) {
    const cuda::DeviceMemory m = cuda::device_memory(i);
    out.push_back({m.name, m.total_gb});
  }
#endif
  return out;
}

Result<Runtime> build_runtime(const std::string& model_dir_or_repo, const RuntimeOptions& o) {
  Runtime rt;
  rt.device = resolve_device(o.device);
  if (rt.device.rfind("error: ", 0) == 0) return invalid_argument(rt.device.substr(7));
  if (o.max_running_requests < 1)
    return invalid_argument("--max-running-requests must be >= 1, got " + std::to_string(o.max_running_requests));
  if (o.page_size_tokens < 1)
    return invalid_argument("--page-size must be >= 1, got " + std::to_string(o.page_size_tokens));
  const int W = o.tp_size;
  if (W < 1 || o.ep_size < 1 || W % o.ep_size != 0)
    return invalid_argument("--tp-size " + std::to_string(W) + " and --ep-size " + std::to_string(o.ep_size) +
                            ": both >= 1, and --ep-size must divide --tp-size");
  if (W > 1 && rt.device != "cpu")
    return failed_precondition("--tp-size " + std::to_string(W) + " on " + rt.device +
                               ": the NCCL backend for several GPUs is not in this build yet; the CPU backend "
                               "(--device cpu) runs tensor/expert parallel ranks as threads");
  auto ckpt = MR_TRY(Checkpoint::open(model_dir_or_repo));
  {
    const ModelConfig cfg = MR_TRY(parse_model_config(ckpt->config(), ckpt->dir() + "/config.json"));
    MR_RETURN_IF_ERROR(check_parallel_split(cfg, W, o.ep_size));
  }
  // One backend per rank; the ranks of a CPU group talk through shared memory.
  std::vector<std::unique_ptr<Communicator>> comms;
  if (W > 1) comms = cpu::make_thread_group(W);
  std::vector<std::unique_ptr<Ops>> rank_ops;
  for (int r = 0; r < W; ++r) rank_ops.push_back(MR_TRY(make_ops(rt.device, o, W > 1 ? std::move(comms[r]) : nullptr)));
  Ops* ops = rank_ops[0].get();
  const DType kv_dtype = MR_TRY(kv_dtype_for(o.kv_cache_dtype, ops->act_dtype()));
  rt.dtype_name = ops->act_dtype() == DType::BF16 ? "bfloat16" : "float32";

  // Weights.
  const HostMemory host_before = host_memory();
  if (o.log)
    MR_LOG(INFO) << "Load weight begin. device=" << ops->name() << ", avail mem="
                 << fmt2(ops->free_bytes() < (int64_t{1} << 60) ? ops->free_bytes() / kGiB
                                                                : host_before.available_bytes / kGiB)
                 << " GB, checkpoint=" << fmt2(ckpt->total_bytes() / 1e9) << " GB";
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::unique_ptr<Model>> models;
  for (int r = 0; r < W; ++r) {
    LoadOptions load;
    load.rank = r;
    load.world_size = W;
    load.ep_size = o.ep_size;
    load.log_progress = o.log && r == 0;
    models.push_back(MR_TRY(load_model(*rank_ops[r], *ckpt, load)));
  }
  Model* model = models[0].get();
  rt.config = model->config();
  const HostMemory host_after = host_memory();
  if (o.log)
    MR_LOG(INFO) << "Load weight end. elapsed=" << fmt2(seconds_since(t0)) << " s, type=" << rt.config.model_type
                 << ", dtype=" << rt.dtype_name << ", weights=" << fmt2(model->weight_bytes() / kGiB)
                 << (W > 1 ? " GB per rank x " + std::to_string(W) + " ranks (tp " + std::to_string(W) + ", ep " +
                                 std::to_string(o.ep_size) + ")"
                           : std::string(""))
                 << " GB, avail mem="
                 << fmt2(ops->free_bytes() < (int64_t{1} << 60) ? ops->free_bytes() / kGiB
                                                                : host_after.available_bytes / kGiB)
                 << " GB, peak host RSS=" << fmt2(host_after.peak_rss_bytes / kGiB) << " GB ("
                 << fmt2(100.0 * host_after.peak_rss_bytes / std::max<double>(1, ckpt->total_bytes()))
                 << "% of the checkpoint)";
  ckpt.reset();

  // Cache pools: state slots (live + prefix snapshots) first, the rest KV pages.
  const CacheSpec spec = model->cache_spec();
  CacheLayout layout;
  layout.kv_bytes_per_token = spec.kv_bytes_per_token(kv_dtype);
  layout.state_bytes_per_slot = spec.state_bytes_per_slot();
  const int running = o.max_running_requests;
  const int snapshots = o.prefix_cache ? (o.prefix_snapshot_slots >= 0 ? o.prefix_snapshot_slots : running) : 0;
  const int64_t context_len = o.context_length > 0                  ? o.context_length
                              : rt.config.max_position_embeddings > 0 ? rt.config.max_position_embeddings
                                                                      : 4096;
  int64_t budget = 0;
  if (rt.device == "cpu") {
    // The CPU backend's "static memory" is a fraction of available RAM, capped at what
    // every running sequence at the full context would use, and at least one full context.
    const double fraction = o.mem_fraction_static > 0 ? o.mem_fraction_static : defaults::kCpuMemFractionStatic;
    const int64_t slots_bytes = layout.state_bytes_per_slot * (running + snapshots);
    const int64_t full = layout.kv_bytes_per_token * context_len * running + slots_bytes;
    const int64_t ps = o.page_size_tokens;
    const int64_t least = slots_bytes + layout.kv_bytes_per_token * ((std::max<int64_t>(context_len, ps) + ps - 1) / ps * ps);
    // The ranks of a CPU group share this RAM: each gets its part.
    budget = std::max(std::min(static_cast<int64_t>(fraction * host_after.available_bytes) / W, full), least);
  } else {
    // What the device arena has left once the scratch of the largest step is set aside.
    const int64_t scratch = model->scratch_bytes(o.max_tokens_per_step, std::min<int64_t>(context_len, 32768));
    budget = ops->free_bytes() - scratch;
  }
  rt.cache = MR_TRY(size_cache_from_budget(layout, budget, o.page_size_tokens, running, snapshots, o.max_total_tokens));
  rt.cache.prefix_block_tokens = o.prefix_cache ? o.prefix_block_tokens : 0;

  RunnerOptions ro;
  ro.max_seqs_per_step = running;
  ro.max_tokens_per_step = o.max_tokens_per_step;
  ro.cuda_graphs = o.cuda_graphs;
  ro.fail_after_steps = o.fail_after_steps;
  if (W == 1) {
    rt.runner = MR_TRY(ModelRunner::create(std::move(rank_ops[0]), std::move(models[0]), rt.cache, ro));
  } else {
    std::vector<std::unique_ptr<ModelRunner>> ranks;
    for (int r = 0; r < W; ++r) {
      ro.rank = r;
      ranks.push_back(MR_TRY(ModelRunner::create(std::move(rank_ops[r]), std::move(models[r]), rt.cache, ro)));
    }
    rt.runner = MR_TRY(ParallelRunner::create(std::move(ranks)));
  }
  if (o.log) {
    // SGLang's line, which the seed's users read: dtype, #tokens, KV size; then our detail.
    MR_LOG(INFO) << "KV Cache is allocated. dtype: " << (kv_dtype == DType::BF16 ? "bfloat16" : "float32")
                 << ", #tokens: " << rt.cache.total_tokens() << ", KV size: " << fmt2(rt.cache.kv_bytes() / 1e9)
                 << " GB (" << rt.cache.num_pages << " pages x " << rt.cache.page_size_tokens << " tokens, "
                 << layout.kv_bytes_per_token << " bytes/token); state: " << rt.cache.num_state_slots << " + "
                 << rt.cache.num_snapshot_slots << " prefix-snapshot slots x " << layout.state_bytes_per_slot
                 << " bytes (" << fmt2(rt.cache.state_bytes() / kGiB) << " GiB)";
    MR_LOG(INFO) << "Memory pool end. avail mem="
                 << fmt2(rt.runner->free_bytes() < (int64_t{1} << 60) ? rt.runner->free_bytes() / kGiB
                                                                       : host_memory().available_bytes / kGiB)
                 << " GB";
  }
  return rt;
}

}  // namespace moonrun
