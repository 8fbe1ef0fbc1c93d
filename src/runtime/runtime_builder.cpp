#include "runtime/runtime_builder.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/thread_comm.h"
#include "backend/standin_comm.h"
#include "common/host_memory.h"
#include "common/log.h"
#include "model/checkpoint.h"
#include "model/model.h"
#include "runtime/parallel_groups.h"
#include "runtime/parallel_runner.h"
#if MOONRUN_HAS_CUDA
#include "backend/cuda/common/device_peaks.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/nccl_comm.h"
#include "backend/cuda/standin_comm.h"
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
  // fp8 is e4m3 (vLLM's and SGLang's meaning of "fp8"): half the bytes of bf16 per cached
  // token, each value rounded to nearest and saturated at +-448 with scale 1.
  if (asked == "fp8" || asked == "fp8_e4m3") return DType::F8_E4M3;
  if (asked == "fp8_e5m2")
    return invalid_argument("--kv-cache-dtype fp8_e5m2 is not supported: moonrun's fp8 MLA cache is e4m3 "
                            "(use --kv-cache-dtype fp8_e4m3 or fp8)");
  return invalid_argument("--kv-cache-dtype must be auto, bfloat16, float32 or fp8_e4m3, got \"" + asked + "\"");
}

// The DSA indexer-key cache's rows (backend/dsa_index_row.h).
Result<DType> index_dtype_for(const std::string& asked, DType act) {
  if (asked == "auto") return act == DType::BF16 ? DType::F8_E4M3 : DType::F32;
  if (asked == "fp8" || asked == "fp8_e4m3") return DType::F8_E4M3;
  if (asked == "float32" || asked == "fp32") return DType::F32;
  return invalid_argument("--index-cache-dtype must be auto, fp8 or float32, got \"" + asked + "\"");
}

// The KV cache dtype as SGLang's log line spells it.
const char* kv_dtype_name(DType d) {
  return d == DType::BF16 ? "bfloat16" : d == DType::F8_E4M3 ? "float8_e4m3fn" : "float32";
}

// Local rank `local_index`'s backend (its GPU is cuda_device + local_index).
Result<std::unique_ptr<Ops>> make_ops(const std::string& device, const RuntimeOptions& o, int local_index,
                                      std::unique_ptr<Communicator> comm) {
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
  co.device = o.cuda_device + local_index;
  co.mem_fraction_static = o.mem_fraction_static > 0 ? o.mem_fraction_static : defaults::kCudaMemFractionStatic;
  co.float32 = o.dtype == "float32";
  return cuda::make_cuda_ops(co, std::move(comm));
#else
  return failed_precondition("--device cuda: this build has no CUDA backend");
#endif
}

// The NCCL communicators of this process's GPUs (ranks first_rank.., GPUs cuda_device..).
Result<std::vector<std::unique_ptr<Communicator>>> make_nccl_group(const RuntimeOptions& o, int local) {
#if MOONRUN_HAS_CUDA
  if (o.nccl_id_hex.empty() && local < o.tp_size)
    return invalid_argument("ranks in other processes need node 0's NCCL id (the control plane hands it out)");
  const cuda::NcclUniqueId id =
      o.nccl_id_hex.empty() ? MR_TRY(cuda::nccl_unique_id()) : MR_TRY(cuda::NcclUniqueId::from_hex(o.nccl_id_hex));
  std::vector<int> devices;
  for (int i = 0; i < local; ++i) devices.push_back(o.cuda_device + i);
  if (const int n = cuda::device_count(); o.cuda_device + local > n)
    return invalid_argument(std::to_string(local) + " ranks on this node need " + std::to_string(local) +
                            " GPUs from cuda:" + std::to_string(o.cuda_device) + "; " + std::to_string(n) +
                            " are visible");
  return cuda::make_nccl_comms(id, o.tp_size, o.first_rank, devices);
#else
  (void)o;
  (void)local;
  return failed_precondition("NCCL needs the CUDA backend");
#endif
}

// This process's members of one group that may span processes: ranks [first_rank,
// first_rank + devices.size()) of `size`, from node 0's id for the group.
Result<std::vector<std::unique_ptr<Communicator>>> make_nccl_share(const std::string& id_hex, int size, int first_rank,
                                                                   const std::vector<int>& devices) {
#if MOONRUN_HAS_CUDA
  const cuda::NcclUniqueId id = MR_TRY(cuda::NcclUniqueId::from_hex(id_hex));
  if (const int n = cuda::device_count(); *std::max_element(devices.begin(), devices.end()) >= n)
    return invalid_argument("this node's ranks need cuda:" +
                            std::to_string(*std::max_element(devices.begin(), devices.end())) + "; " +
                            std::to_string(n) + " GPUs are visible");
  return cuda::make_nccl_comms(id, size, first_rank, devices);
#else
  (void)id_hex;
  (void)size;
  (void)first_rank;
  (void)devices;
  return failed_precondition("NCCL needs the CUDA backend");
#endif
}

// A stage boundary's two-rank NCCL link, both GPUs in this process (the earlier stage's
// first): what Ops::set_pipeline takes.
Result<std::vector<std::unique_ptr<Communicator>>> make_nccl_pair(int device_from, int device_to) {
#if MOONRUN_HAS_CUDA
  const cuda::NcclUniqueId id = MR_TRY(cuda::nccl_unique_id());
  if (const int n = cuda::device_count(); std::max(device_from, device_to) >= n)
    return invalid_argument("--pp-size: a stage needs cuda:" + std::to_string(std::max(device_from, device_to)) +
                            "; " + std::to_string(n) + " GPUs are visible");
  return cuda::make_nccl_comms(id, 2, 0, {device_from, device_to});
#else
  (void)device_from;
  (void)device_to;
  return failed_precondition("NCCL needs the CUDA backend");
#endif
}

}  // namespace

Result<std::string> make_nccl_id_hex() {
#if MOONRUN_HAS_CUDA
  return MR_TRY(cuda::nccl_unique_id()).hex();
#else
  return failed_precondition("NCCL needs the CUDA backend, which this build does not have");
#endif
}

Result<std::unique_ptr<Ops>> make_device_ops(const RuntimeOptions& o) {
  const std::string device = resolve_device(o.device);
  if (device.rfind("error: ", 0) == 0) return failed_precondition(device.substr(7));
  return make_ops(device, o, 0, nullptr);
}

Result<DevicePeakFigures> measure_device_peaks(int cuda_device) {
#if MOONRUN_HAS_CUDA
  try {
    const cuda::DevicePeaks p = cuda::measure_device_peaks(cuda_device);
    return DevicePeakFigures{p.copy_gb_s, p.bf16_tflops};
  } catch (const std::exception& e) {
    return failed_precondition(std::string("measuring the GPU's copy bandwidth and GEMM rate: ") + e.what());
  }
#else
  (void)cuda_device;
  return failed_precondition("this build has no CUDA backend");
#endif
}

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

Result<LoadedRanks> load_ranks(const std::string& model_dir_or_repo, const RuntimeOptions& o) {
  LoadedRanks lr;
  lr.device = resolve_device(o.device);
  if (lr.device.rfind("error: ", 0) == 0) return invalid_argument(lr.device.substr(7));
  if (o.max_running_requests < 1)
    return invalid_argument("--max-running-requests must be >= 1, got " + std::to_string(o.max_running_requests));
  if (o.page_size_tokens < 1)
    return invalid_argument("--page-size must be >= 1, got " + std::to_string(o.page_size_tokens));
  const int W = o.tp_size;
  if (W < 1 || o.ep_size < 1 || W % o.ep_size != 0)
    return invalid_argument("--tp-size " + std::to_string(W) + " and --ep-size " + std::to_string(o.ep_size) +
                            ": both >= 1, and --ep-size must divide --tp-size");
  const int P = o.pp_size;
  if (P < 1) return invalid_argument("--pp-size must be >= 1, got " + std::to_string(P));
  const int world = W * P;
  const bool standin = o.standin_collective_us >= 0;
  if (standin && (W < 2 || P > 1 || o.first_rank != 0 || o.local_ranks > 1 || o.dp_attention || o.prefill_lane_tokens > 0))
    return invalid_argument("a stand-in group (--standin-collective-us) times rank 0 of --tp-size >= 2 alone: not with "
                            "--pp-size, --nnodes, --enable-dp-attention or a prefill lane");
  const int local = standin ? 1 : o.local_ranks > 0 ? o.local_ranks : world;
  if (o.first_rank < 0 || o.first_rank + local > world)
    return invalid_argument("ranks [" + std::to_string(o.first_rank) + ", " + std::to_string(o.first_rank + local) +
                            ") are not in a group of " + std::to_string(world));
  const bool gpu_groups = P > 1 && local != world && lr.device == "cuda" && !o.nccl_group_ids_hex.empty();
  if (gpu_groups && static_cast<int>(o.nccl_group_ids_hex.size()) != num_parallel_groups(W, P))
    return invalid_argument(std::to_string(o.nccl_group_ids_hex.size()) + " NCCL ids for the " +
                            std::to_string(num_parallel_groups(W, P)) + " groups of --tp-size " + std::to_string(W) +
                            " x --pp-size " + std::to_string(P) + " (node 0 makes them)");
  if (P > 1 && local != world && !o.make_comm && !gpu_groups)
    return invalid_argument("--pp-size " + std::to_string(P) + " over " + std::to_string(world / std::max(local, 1)) +
                            " processes: " +
                            (lr.device == "cuda" ? "the GPUs need node 0's NCCL id for every group"
                                                 : "the CPU ranks need a way to meet the other processes'") +
                            " (moonrun serve --nnodes hands them out)");
  if (P > 1 && !o.draft_model.empty())
    return unimplemented("a DSpark draft reads the target's layers on one rank: not with --pp-size > 1");
  if (o.dp_attention) {
    if (W < 2) return invalid_argument("--enable-dp-attention needs a group to share the experts: --tp-size >= 2");
    if (P > 1) return unimplemented("--enable-dp-attention with --pp-size > 1 is not built yet");
    if (o.split_router || o.split_latent_moe || o.split_latent_up)
      return invalid_argument("--enable-dp-attention holds the router and the LatentMoE projections whole on every "
                              "rank: not with --split-router / --split-latent-moe");
    if (o.num_speculative_tokens > 0 || !o.draft_model.empty())
      return unimplemented("speculative decoding with --enable-dp-attention is not built yet");
  }
  auto ckpt = MR_TRY(Checkpoint::open(model_dir_or_repo));
  std::vector<StageLayers> stages;  // by stage
  {
    const ModelConfig cfg = MR_TRY(parse_model_config(ckpt->config(), ckpt->dir() + "/config.json"));
    MR_RETURN_IF_ERROR(check_parallel_split(cfg, W, o.ep_size, o.dp_attention));
    if (o.split_router && cfg.num_experts > 0 && cfg.num_experts % W != 0)
      return invalid_argument("--split-router: the model's " + std::to_string(cfg.num_experts) +
                              " experts do not split evenly over --tp-size " + std::to_string(W));
    if (o.split_latent_up && !o.split_latent_moe)
      return invalid_argument("the LatentMoE up projection splits only with the down one (--split-latent-moe)");
    if (o.split_latent_moe && cfg.routed_expert_hidden_size > 0 && cfg.routed_expert_hidden_size % W != 0)
      return invalid_argument("--split-latent-moe: the LatentMoE width " + std::to_string(cfg.routed_expert_hidden_size) +
                              " (routed_expert_hidden_size) does not split evenly over --tp-size " + std::to_string(W));
    for (int s = 0; s < P; ++s) stages.push_back(MR_TRY(stage_layers(cfg, W, o.ep_size, P, s)));
  }
  // One backend per local rank. GPUs talk through NCCL; CPU ranks through o.make_comm
  // (another process's ranks), or shared memory when the whole group is in this process.
  // Under pipeline parallelism every stage has its own tensor-parallel group, and each
  // stage boundary a two-rank link per tensor-parallel rank (Ops::set_pipeline).
  std::vector<std::unique_ptr<Communicator>> comms;  // by local index
  std::vector<std::unique_ptr<Communicator>> pipe_prev(static_cast<size_t>(local)), pipe_next(static_cast<size_t>(local));
  if (standin) {
    comms.push_back(lr.device == "cuda" ?
#if MOONRUN_HAS_CUDA
                                        cuda::make_standin_comm(W, o.standin_collective_us)
#else
                                        nullptr
#endif
                                        : make_standin_comm(W, o.standin_collective_us));
  } else if (gpu_groups) {
    // GPU stages across nodes: every group (each stage's TP group, each ring link) an NCCL
    // communicator from node 0's id for it, this process making its own members, every
    // process walking the groups in one order (a creation returns once the group's other
    // processes have joined it; runtime/parallel_groups.h).
    comms.resize(static_cast<size_t>(local));
    for (const ProcessGroup& pg : process_groups(W, P, o.first_rank, local)) {
      std::vector<int> devices;
      for (const GroupMember& m : pg.members) devices.push_back(o.cuda_device + m.local);
      auto made = MR_TRY(make_nccl_share(o.nccl_group_ids_hex[static_cast<size_t>(pg.group)], pg.size,
                                         pg.members[0].group_rank, devices));
      for (size_t i = 0; i < pg.members.size(); ++i) {
        const GroupMember& m = pg.members[i];
        auto& slot = !pg.link ? comms[static_cast<size_t>(m.local)]
                     : m.group_rank == 0 ? pipe_next[static_cast<size_t>(m.local)]
                                         : pipe_prev[static_cast<size_t>(m.local)];
        slot = std::move(made[i]);
      }
    }
  } else if (P > 1 && o.make_comm) {
    // Ranks in several processes: every group through o.make_comm (its numbering above).
    // A ring link's rank 0 is its member on the lower process (the sender when both are in
    // one), so a link between node 0 and another node has its hub on node 0.
    comms.resize(static_cast<size_t>(local));
    const auto process_of = [&](int rank) { return rank / local; };
    const auto link = [&](int s, int t, bool sending) -> Result<std::unique_ptr<Communicator>> {
      const int from = s * W + t, to = (s + 1) % P * W + t;
      const bool sender_hub = process_of(from) <= process_of(to);
      const int hub = sender_hub ? from : to;
      const int rank = sending == sender_hub ? 0 : 1;
      return o.make_comm(P + s * W + t, rank, 2, process_of(hub), process_of(from) == process_of(to));
    };
    for (int i = 0; i < local; ++i) {
      const int g = o.first_rank + i, s = g / W, t = g % W;
      if (W > 1)
        comms[static_cast<size_t>(i)] =
            MR_TRY(o.make_comm(s, t, W, process_of(s * W), process_of(s * W) == process_of(s * W + W - 1)));
      pipe_next[static_cast<size_t>(i)] = MR_TRY(link(s, t, /*sending=*/true));
      pipe_prev[static_cast<size_t>(i)] = MR_TRY(link((s + P - 1) % P, t, /*sending=*/false));
    }
  } else if (P > 1) {
    comms.resize(static_cast<size_t>(world));
    for (int s = 0; s < P; ++s) {
      std::vector<std::unique_ptr<Communicator>> group;
      if (lr.device == "cuda" && (W > 1 || o.nccl_at_one_rank)) {
        RuntimeOptions stage_o = o;
        stage_o.cuda_device = o.cuda_device + s * W;
        stage_o.first_rank = 0;
        stage_o.nccl_id_hex.clear();
        group = MR_TRY(make_nccl_group(stage_o, W));
      } else if (W > 1) {
        group = cpu::make_thread_group(W);
      }
      for (int t = 0; t < static_cast<int>(group.size()); ++t) comms[static_cast<size_t>(s * W + t)] = std::move(group[t]);
    }
    // The ring (model/pipeline.h): stage s to s + 1, and the last stage back to stage 0.
    for (int s = 0; s < P; ++s)
      for (int t = 0; t < W; ++t) {
        const int from = s * W + t, to = (s + 1) % P * W + t;
        std::vector<std::unique_ptr<Communicator>> pair;
        pair = lr.device == "cuda" ? MR_TRY(make_nccl_pair(o.cuda_device + from, o.cuda_device + to))
                                   : cpu::make_thread_group(2);
        pipe_next[static_cast<size_t>(from)] = std::move(pair[0]);
        pipe_prev[static_cast<size_t>(to)] = std::move(pair[1]);
      }
  } else if (lr.device == "cuda" && (W > 1 || o.nccl_at_one_rank)) {
    comms = MR_TRY(make_nccl_group(o, local));
  } else if (W > 1 && !o.make_comm) {
    comms = cpu::make_thread_group(W);
  }
  for (int i = 0; i < local; ++i) {
    std::unique_ptr<Communicator> comm;
    if (!comms.empty()) comm = std::move(comms[i]);
    else if (W > 1) comm = MR_TRY(o.make_comm(0, o.first_rank + i, W, 0, false));
    lr.ops.push_back(MR_TRY(make_ops(lr.device, o, i, std::move(comm))));
    if (P > 1) {
      try {
        lr.ops.back()->set_pipeline(std::move(pipe_prev[static_cast<size_t>(i)]),
                                    std::move(pipe_next[static_cast<size_t>(i)]));
      } catch (const BackendError& e) {
        return failed_precondition(std::string("--pp-size: ") + e.what());
      }
    }
  }
  Ops& ops0 = *lr.ops[0];
  lr.layout.kv_dtype = MR_TRY(kv_dtype_for(o.kv_cache_dtype, ops0.act_dtype()));
  const DType index_dtype = MR_TRY(index_dtype_for(o.index_cache_dtype, ops0.act_dtype()));
  lr.dtype_name = ops0.act_dtype() == DType::BF16 ? "bfloat16" : "float32";

  // Weights: each local rank reads its byte ranges.
  const HostMemory host_before = host_memory();
  if (o.log && o.dp_attention)
    MR_LOG(INFO) << "DP attention: " << W << " ranks, each with attention, the dense layers and the vocabulary whole "
                 << "for its own sequences; the routed experts over --ep-size " << o.ep_size
                 << "; prefix cache and CUDA graphs off";
  if (o.log)
    MR_LOG(INFO) << "Load weight begin. device=" << ops0.name() << ", avail mem="
                 << fmt2(ops0.free_bytes() < (int64_t{1} << 60) ? ops0.free_bytes() / kGiB
                                                                 : host_before.available_bytes / kGiB)
                 << " GB, checkpoint=" << fmt2(ckpt->total_bytes() / 1e9) << " GB";
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < local; ++i) {
    const int g = o.first_rank + i;  // stage g / W, its rank g % W
    LoadOptions load;
    load.rank = g % W;
    load.world_size = W;
    load.ep_size = o.ep_size;
    load.stage = stages[static_cast<size_t>(g / W)];
    load.split_router = o.split_router;
    load.split_latent_moe = o.split_latent_moe;
    load.split_latent_up = o.split_latent_up;
    load.dp_attention = o.dp_attention;
    load.log_progress = o.log && i == 0;
    load.max_positions = o.context_length;
    load.index_cache_dtype = index_dtype;
    lr.ops[i]->bind_thread();
    lr.models.push_back(MR_TRY(load_model(*lr.ops[i], *ckpt, load)));
  }
  const Model& model = *lr.models[0];
  lr.config = model.config();
  if (!o.draft_model.empty()) {
    if (W > 1) return unimplemented("a DSpark draft runs with --tp-size 1 for now");
    const auto td = std::chrono::steady_clock::now();
    lr.draft = MR_TRY(DSparkDraft::load(*lr.ops[0], o.draft_model, lr.config, o.log));
    if (o.log)
      MR_LOG(INFO) << "Load draft end. DSpark " << lr.draft->dir() << ": " << lr.draft->config().num_layers
                   << " layers, block " << lr.draft->config().block_size << ", taps "
                   << lr.draft->config().n_taps() << ", weights " << fmt2(lr.draft->weight_bytes() / kGiB)
                   << " GB, elapsed=" << fmt2(seconds_since(td)) << " s";
  }
  const HostMemory host_after = host_memory();
  if (o.log)
    MR_LOG(INFO) << "Load weight end. elapsed=" << fmt2(seconds_since(t0)) << " s, type=" << lr.config.model_type
                 << ", dtype=" << lr.dtype_name << ", weights=" << fmt2(model.weight_bytes() / kGiB) << " GB"
                 << (world > 1 ? " per rank x " + std::to_string(local) + " ranks here (tp " + std::to_string(W) +
                                     ", ep " + std::to_string(o.ep_size) +
                                     (P > 1 ? ", pp " + std::to_string(P) : std::string()) + ")"
                               : std::string(""))
                 << ", avail mem="
                 << fmt2(ops0.free_bytes() < (int64_t{1} << 60) ? ops0.free_bytes() / kGiB
                                                                 : host_after.available_bytes / kGiB)
                 << " GB, peak host RSS=" << fmt2(host_after.peak_rss_bytes / kGiB) << " GB"
                 // The share of the checkpoint says whether the load streamed; under 1 GiB the
                 // process's own baseline (a CUDA context alone is ~1 GB) is all it would show.
                 << (ckpt->total_bytes() >= kGiB
                         ? " (" + fmt2(100.0 * host_after.peak_rss_bytes / ckpt->total_bytes()) + "% of the checkpoint)"
                         : std::string(""));

  if (P > 1 && o.log)
    for (int s = 0; s < P; ++s)
      MR_LOG(INFO) << "Pipeline stage " << s << ": layers " << stages[size_t(s)].first_layer << "-"
                   << stages[size_t(s)].end_layer - 1 << " on ranks " << s * W << "-" << (s + 1) * W - 1
                   << (s == 0 ? " (+ embedding, norm, lm_head: the last stage's rows come back here)" : "");

  // What the cache pools may use on this process's ranks. Every rank's pools have the same
  // slots and pages (the scheduler's ids mean the same thing everywhere); under pipeline
  // parallelism the stages' bytes differ, and the largest of every stage's, those in other
  // processes too (Model::cache_spec_of_layers), sizes them.
  CacheSpec spec = model.cache_spec();
  int64_t state_floats = spec.state_floats_per_slot;
  for (const StageLayers& st : stages) {
    const CacheSpec s = model.cache_spec_of_layers(st.first_layer, st.end_layer);
    if (s.kv_bytes_per_token(*lr.layout.kv_dtype) > spec.kv_bytes_per_token(*lr.layout.kv_dtype)) spec = s;
    state_floats = std::max(state_floats, s.state_floats_per_slot);
  }
  spec.state_floats_per_slot = state_floats;
  lr.layout.kv_bytes_per_token = spec.kv_bytes_per_token(*lr.layout.kv_dtype);
  if (lr.draft)  // the draft's context rows share the target's pages (model/dspark_draft.h)
    lr.layout.kv_bytes_per_token += static_cast<int64_t>(lr.draft->config().num_layers) *
                                    lr.draft->config().cache_row_width() * dtype_size_bytes(*lr.layout.kv_dtype);
  lr.layout.state_bytes_per_slot = spec.state_bytes_per_slot();
  const int running = o.max_running_requests;
  const bool prefix_cache = o.prefix_cache && !o.dp_attention;  // RuntimeOptions::dp_attention
  const int snapshots = prefix_cache ? (o.prefix_snapshot_slots >= 0 ? o.prefix_snapshot_slots : running) : 0;
  const int64_t context_len = o.context_length > 0                  ? o.context_length
                              : lr.config.max_position_embeddings > 0 ? lr.config.max_position_embeddings
                                                                      : 4096;
  if (lr.device == "cpu") {
    // The CPU backend's "static memory" is a fraction of available RAM, capped at what
    // every running sequence at the full context would use, and at least one full context.
    // The ranks in this process share the RAM: each gets its part.
    const double fraction = o.mem_fraction_static > 0 ? o.mem_fraction_static : defaults::kCpuMemFractionStatic;
    const int64_t slots_bytes =
        lr.layout.state_bytes_per_slot * (running + snapshots + (o.num_speculative_tokens > 0 ? running : 0));
    const int64_t full = lr.layout.kv_bytes_per_token * context_len * running + slots_bytes;
    const int64_t ps = o.page_size_tokens;
    const int64_t least =
        slots_bytes + lr.layout.kv_bytes_per_token * ((std::max<int64_t>(context_len, ps) + ps - 1) / ps * ps);
    lr.budget_bytes =
        std::max(std::min(static_cast<int64_t>(fraction * host_after.available_bytes) / local, full), least);
  } else {
    // What the device arena has left once the scratch of the largest step is set aside (and a
    // prefill lane's: its steps run beside the others, with scratch of their own).
    const int64_t scratch = model.scratch_bytes(o.max_tokens_per_step) +
                            (o.prefill_lane_tokens > 0 ? model.scratch_bytes(o.prefill_lane_tokens) : 0);
    // Speculative decoding's saved rows (ModelRunner: one step's verified rows).
    int64_t replay_floats = 0;
    for (const auto& m : lr.models) replay_floats = std::max(replay_floats, m->replay_floats_per_token());
    const int64_t replay = o.num_speculative_tokens > 0 && spec.state_floats_per_slot > 0
                               ? int64_t{4} * replay_floats * running * (1 + o.num_speculative_tokens)
                               : 0;
    // A DSpark draft's taps (every target row a step carries, per tapped layer) and its
    // fixed tables (ModelRunner::attach_draft).
    int64_t draft_fixed = 0;
    if (lr.draft) {
      const DSparkConfig& dc = lr.draft->config();
      // (and the prefill lane's own taps, a chunk's rows)
      const int64_t tap_rows = std::max<int64_t>(o.max_tokens_per_step,
                                                 static_cast<int64_t>(running) *
                                                     (1 + std::max(o.num_speculative_tokens, dc.block_size))) +
                               std::max(o.prefill_lane_tokens, 0);
      draft_fixed = int64_t{4} * dc.n_taps() * tap_rows * dc.hidden_size +
                    lr.draft->fixed_bytes(running, context_len + dc.block_size);
    }
    int64_t least_free = ops0.free_bytes();
    for (const auto& ops : lr.ops) least_free = std::min(least_free, ops->free_bytes());
    lr.budget_bytes = least_free - scratch - replay - draft_fixed;
  }
  return lr;
}

Result<CacheConfig> size_cache(const LoadedRanks& lr, int64_t budget_bytes, const RuntimeOptions& o) {
  const int running = o.max_running_requests;
  const bool prefix_cache = o.prefix_cache && !o.dp_attention;  // RuntimeOptions::dp_attention
  const int snapshots = prefix_cache ? (o.prefix_snapshot_slots >= 0 ? o.prefix_snapshot_slots : running) : 0;
  // DP attention: a rank holds the state slots of its own sequences only (slot mod tp_size,
  // ModelRunner::step_dp), so one rank's budget pays for ceil(running / tp_size) of them (no
  // snapshots or verify slots there: no prefix cache, no speculation).
  const int dp = o.dp_attention && o.tp_size > 1 ? o.tp_size : 1;
  CacheConfig cache = MR_TRY(
      size_cache_from_budget(lr.layout, budget_bytes, o.page_size_tokens, (running + dp - 1) / dp, snapshots,
                             o.max_total_tokens,
                             o.num_speculative_tokens > 0 && lr.layout.state_bytes_per_slot > 0 ? running : 0));
  cache.num_state_slots = running;
  cache.prefix_block_tokens = prefix_cache ? o.prefix_block_tokens : 0;
  if (o.dp_attention && o.tp_size > 1) {
    // Each rank holds only the pages of its own sequences (CacheConfig::page_groups): the
    // budget sized one rank's, so the scheduler has tp_size times those pages.
    const int64_t pages = static_cast<int64_t>(cache.num_pages) * o.tp_size;
    if (pages > INT32_MAX / 2)
      return resource_exhausted("cache: " + std::to_string(pages) + " pages over " + std::to_string(o.tp_size) +
                                " DP ranks is more than the page ids hold");
    cache.num_pages = static_cast<int>(pages);
    cache.page_groups = o.tp_size;
  }
  return cache;
}

Result<std::unique_ptr<StepRunner>> make_runner(LoadedRanks& lr, const CacheConfig& cache, const RuntimeOptions& o) {
  RunnerOptions ro;
  ro.max_seqs_per_step = o.max_running_requests;
  ro.max_tokens_per_step = o.max_tokens_per_step;
  ro.cuda_graphs = o.cuda_graphs && !o.dp_attention;  // RuntimeOptions::dp_attention
  ro.dp_attention_size = o.dp_attention ? o.tp_size : 1;
  ro.pipeline_micro_batches = o.pp_micro_batches;
  ro.fail_after_steps = o.fail_after_steps;
  ro.num_speculative_tokens = o.num_speculative_tokens;
  ro.max_positions = o.context_length > 0 ? o.context_length : std::max<int64_t>(lr.config.max_position_embeddings, 0);
  const int local = static_cast<int>(lr.ops.size());
  std::unique_ptr<StepRunner> runner;
  if (o.tp_size * o.pp_size == 1) {
    lr.ops[0]->bind_thread();
    auto single = MR_TRY(ModelRunner::create(std::move(lr.ops[0]), std::move(lr.models[0]), cache, ro));
    if (lr.draft) MR_RETURN_IF_ERROR(single->attach_draft(std::move(lr.draft)));
    if (o.prefill_lane_tokens > 0) MR_RETURN_IF_ERROR(single->enable_prefill_lane(o.prefill_lane_tokens));
    runner = std::move(single);
  } else {
    const int W = o.tp_size;
    if (o.prefill_lane_tokens > 0 && (o.pp_size > 1 || o.dp_attention || local != W))
      return unimplemented("--prefill-lane-min-tokens: a prefill lane runs beside one GPU or a tensor-parallel group "
                           "in one process (not with --pp-size > 1, --enable-dp-attention or --nnodes > 1)");
    std::vector<std::unique_ptr<ModelRunner>> ranks;
    for (int i = 0; i < local; ++i) {
      ro.rank = o.first_rank + i;
      lr.ops[i]->bind_thread();
      ranks.push_back(MR_TRY(ModelRunner::create(std::move(lr.ops[i]), std::move(lr.models[i]), cache, ro)));
    }
    auto group = MR_TRY(ParallelRunner::create(std::move(ranks)));
    if (o.prefill_lane_tokens > 0) {
      // The lanes' own group: their collectives never share a communicator (or, on GPUs, an
      // NCCL stream) with the main steps', which run at the same time.
      std::vector<std::unique_ptr<Communicator>> lane_comms;
      if (lr.device == "cuda") {
        RuntimeOptions lane_o = o;
        lane_o.nccl_id_hex.clear();
        lane_o.first_rank = 0;
        lane_comms = MR_TRY(make_nccl_group(lane_o, W));
      } else {
        lane_comms = cpu::make_thread_group(W);
      }
      MR_RETURN_IF_ERROR(group->enable_prefill_lane(o.prefill_lane_tokens, std::move(lane_comms)));
    }
    runner = std::move(group);
  }
  lr.ops.clear();
  lr.models.clear();
  if (o.log) {
    // SGLang's line, which the seed's users read: dtype, #tokens, KV size; then our detail.
    MR_LOG(INFO) << "KV Cache is allocated. dtype: " << kv_dtype_name(*lr.layout.kv_dtype)
                 << ", #tokens: " << cache.total_tokens() << ", KV size: " << fmt2(cache.kv_bytes() / 1e9)
                 << " GB (" << cache.num_pages << " pages x " << cache.page_size_tokens << " tokens, "
                 << lr.layout.kv_bytes_per_token << " bytes/token); state: " << cache.num_state_slots << " + "
                 << cache.num_snapshot_slots << " prefix-snapshot slots x " << lr.layout.state_bytes_per_slot
                 << " bytes (" << fmt2(cache.state_bytes() / kGiB) << " GiB"
                 << (cache.page_groups > 1 ? ", a DP rank holds " +
                                                 std::to_string((cache.num_state_slots + cache.page_groups - 1) /
                                                                cache.page_groups) +
                                                 " of the slots and 1/" + std::to_string(cache.page_groups) +
                                                 " of the pages"
                                           : std::string())
                 << ")";
    MR_LOG(INFO) << "Memory pool end. avail mem="
                 << fmt2(runner->free_bytes() < (int64_t{1} << 60) ? runner->free_bytes() / kGiB
                                                                   : host_memory().available_bytes / kGiB)
                 << " GB";
  }
  return runner;
}

Result<Runtime> build_runtime(const std::string& model_dir_or_repo, const RuntimeOptions& o) {
  LoadedRanks lr = MR_TRY(load_ranks(model_dir_or_repo, o));
  Runtime rt;
  rt.device = lr.device;
  rt.dtype_name = lr.dtype_name;
  rt.kv_dtype_name = kv_dtype_name(*lr.layout.kv_dtype);
  rt.config = lr.config;
  rt.weight_bytes = static_cast<int64_t>(lr.models[0]->weight_bytes());
  rt.cache = MR_TRY(size_cache(lr, lr.budget_bytes, o));
  rt.runner = MR_TRY(make_runner(lr, rt.cache, o));
  return rt;
}

}  // namespace moonrun
