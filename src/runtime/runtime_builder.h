#pragma once
// The single builder that assembles backend + model + cache pools for a device: what
// `serve`, `generate` and the benchmarks call, so nothing above runtime/ knows which
// backend runs. Logs the startup stages the seeds' users read: "Load weight begin/end" with
// memory before and after (and the load's peak host RSS), the KV cache line.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/comm.h"
#include "cache/cache_manager.h"
#include "common/status.h"
#include "model/config.h"
#include "runtime/defaults.h"
#include "model/dspark_draft.h"
#include "runtime/model_runner.h"

namespace moonrun {

struct RuntimeOptions {
  std::string device = "auto";          // cpu | cuda | auto (cuda when a GPU is visible)
  std::string dtype = "auto";           // auto | bfloat16 | float32 (CUDA: every op in fp32, to check kernels)
  std::string kv_cache_dtype = "auto";  // auto (the compute dtype) | bf16 | bfloat16 | float32 | fp8 | fp8_e4m3
  // DSA (K3.1) indexer keys: auto (FP8 + a scale when computing in bf16, as DeepSeek-V3.2's
  // indexer cache; F32 with --dtype float32, the reference's fp32 scores) | fp8 | float32.
  std::string index_cache_dtype = "auto";
  int cuda_device = 0;
  // Tensor / expert parallelism (SGLang's --tp-size, --ep-size): tp_size ranks, each with
  // its shard of the weights; on the CPU backend the ranks are threads of this process.
  int tp_size = 1;
  int ep_size = 1;
  // Pipeline parallelism (--pp-size): pp_size stages of contiguous layers, each a tp_size x
  // ep_size group of its own (model/pipeline.h); tp_size * pp_size ranks in all, stage s
  // on ranks [s * tp_size, (s + 1) * tp_size); the last stage hands its rows back to
  // stage 0, which samples. GPUs: every stage in one process for now.
  int pp_size = 1;
  // Split over each stage's TP group what every rank otherwise holds whole (model/
  // weight_spec.h, WeightLayout): the MoE router, the LatentMoE projections.
  bool split_router = false;
  bool split_latent_moe = false;  // the down projection (--split-latent-moe-down), or
  bool split_latent_up = false;   // with it the up projection too (--split-latent-moe)
  // DP attention (SGLang --enable-dp-attention, with --dp-size equal to --tp-size): each rank
  // holds attention, the dense layers and the vocabulary whole and runs them for its own
  // sequences (a state slot's sequences, slot mod tp_size); the routed experts stay split
  // (--ep-size) and every MoE layer gathers all ranks' rows (model/layers/moe.h). Without a
  // prefix cache (a cached prefix lives on the rank that computed it) and CUDA graphs (a
  // step's shape is every rank's) for now.
  bool dp_attention = false;
  int pp_micro_batches = 0;  // RunnerOptions::pipeline_micro_batches (0: one per stage, 1: none)
  // The ranks this process runs: [first_rank, first_rank + local_ranks) (0: all of them).
  // Ranks in other processes are reached through make_comm: group s < pp_size is stage s's
  // tensor-parallel group, group pp_size + s * tp_size + t the ring link from stage s's rank
  // t to the next stage's (a pair whose rank 0 is the member on the lower process). Its rank
  // 0 is in process hub_process (processes run local_ranks ranks each, in order), and
  // one_process says whether every member is there too. Without make_comm every rank is in
  // this process and talks through shared memory.
  int first_rank = 0;
  int local_ranks = 0;
  // >= 0: time rank 0 of the tp_size group alone on this device (bench-model
  // --standin-collective-us): its shard of the weights, every collective a stand-in that
  // waits this long (backend/standin_comm.h). For timing only: the outputs are not the group's.
  double standin_collective_us = -1;
  std::function<Result<std::unique_ptr<Communicator>>(int group, int rank, int size, int hub_process,
                                                      bool one_process)>
      make_comm;
  // CUDA: the group's NCCL id from node 0 (hex; empty: this process makes one, when it runs
  // every rank), and NCCL even at one rank (tests: TP1 through NCCL equals the plain run).
  std::string nccl_id_hex;
  bool nccl_at_one_rank = false;
  // CUDA stages across processes (--pp-size over nodes): node 0's NCCL id of every group, by
  // make_comm's group number (runtime/parallel_groups.h); each process makes its members.
  std::vector<std::string> nccl_group_ids_hex;
  double mem_fraction_static = 0;       // 0: the backend's default (defaults.h)
  int max_running_requests = defaults::kMaxRunningRequests;
  int max_tokens_per_step = defaults::kChunkedPrefillTokens;
  int page_size_tokens = defaults::kPageSizeTokens;
  int64_t context_length = 0;     // the longest sequence served (sizes the CPU pool); 0: the model's
  int64_t max_total_tokens = 0;   // > 0: cap the KV pool at this many tokens
  bool prefix_cache = true;
  int prefix_block_tokens = defaults::kPrefixBlockTokens;
  int prefix_snapshot_slots = -1;  // -1: as many as max_running_requests
  bool cuda_graphs = true;
  // A second lane for long prefill chunks (ModelRunner::enable_prefill_lane; a single-rank
  // runner without a DSpark draft) taking chunks of this many tokens (0: no lane): its step
  // scratch is set aside beside the main steps' (max_tokens_per_step) before the cache is sized.
  int prefill_lane_tokens = 0;
  // Speculative decoding: drafts a sequence may bring per step (0: off). Adds a verify slot
  // per running request to the cache (models with a recurrent state) and the replay rows.
  int num_speculative_tokens = 0;
  // A DSpark draft beside the target (speculative method dspark): its checkpoint; loaded on
  // the target's GPU after it, its context rows counted in each token's cache bytes.
  std::string draft_model;
  int64_t fail_after_steps = -1;   // tests: the backend fails after this many steps
  bool log = true;                 // the startup log lines
};

struct Runtime {
  std::unique_ptr<StepRunner> runner;  // a ModelRunner, or a ParallelRunner over tp_size x pp_size ranks
  CacheConfig cache;
  ModelConfig config;
  std::string device;      // "cpu" or "cuda"
  std::string dtype_name;  // "float32", "bfloat16"
  std::string kv_dtype_name;  // the MLA cache's: "float32", "bfloat16", "float8_e4m3fn"
  int64_t weight_bytes = 0;  // one rank's weights as loaded on the device
};

// The measured best of one GPU (backend/cuda/common/device_peaks.h): copy bandwidth and the
// bf16 GEMM rate, for benchmarks' ratios. Fails on a build or machine without a GPU.
struct DevicePeakFigures {
  double copy_gb_s = 0;
  double bf16_tflops = 0;
};
Result<DevicePeakFigures> measure_device_peaks(int cuda_device);

// One backend on o.device (its first GPU for cuda), with no model and no communicator: for
// kernel benchmarks that drive the ops directly (tools/bench_kernels.h).
Result<std::unique_ptr<Ops>> make_device_ops(const RuntimeOptions& o);

// A new NCCL rendezvous id (hex) for node 0 to hand to the other nodes.
Result<std::string> make_nccl_id_hex();

// "auto" -> "cuda" when this build has the CUDA backend and a GPU is visible, else "cpu";
// an impossible request -> "error: <reason>".
std::string resolve_device(const std::string& requested);

// The GPUs this build can use, for the startup log ("NVIDIA H200, 139.8 GiB"); empty in a
// CPU-only build or when none is visible.
struct GpuDescription {
  std::string name;
  double total_gib = 0;
};
std::vector<GpuDescription> visible_gpus();
bool has_cuda_backend();

// Opens the checkpoint (a directory or an HF repo id), loads the text model onto the
// device and sizes the cache pools from what is left. Errors are one line each.
Result<Runtime> build_runtime(const std::string& model_dir_or_repo, const RuntimeOptions& options);

// build_runtime in its three phases, for a group spread over processes: every process
// loads its ranks; node 0 sizes the pools from the smallest budget of all; every process
// then makes its runner over the same cache configuration (the scheduler's slot and page
// ids must mean the same thing everywhere).
struct LoadedRanks {
  std::vector<std::unique_ptr<Ops>> ops;  // one per local rank
  std::vector<std::unique_ptr<Model>> models;
  std::unique_ptr<DSparkDraft> draft;  // RuntimeOptions::draft_model, on rank 0
  std::string device, dtype_name;
  ModelConfig config;
  CacheLayout layout;        // the largest rank's bytes per token and per state slot, the KV dtype
  int64_t budget_bytes = 0;  // what one rank's pools may take
};
Result<LoadedRanks> load_ranks(const std::string& model_dir_or_repo, const RuntimeOptions& options);
Result<CacheConfig> size_cache(const LoadedRanks& loaded, int64_t budget_bytes, const RuntimeOptions& options);
Result<std::unique_ptr<StepRunner>> make_runner(LoadedRanks& loaded, const CacheConfig& cache,
                                                const RuntimeOptions& options);

}  // namespace moonrun
