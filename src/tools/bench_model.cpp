#include "tools/bench_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>

#include "backend/op_profile.h"

#include "runtime/parallel_runner.h"
#include "runtime/prefill_lane.h"
#include "runtime/sequence_sampler.h"

namespace moonrun::tools {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Sequence i's tokens: deterministic, spread over the vocabulary.
std::vector<int32_t> tokens_of(int i, int n, int vocab, uint64_t seed) {
  std::vector<int32_t> ids(n);
  uint64_t h = seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(i) * 0xbf58476d1ce4e5b9ull;
  for (int t = 0; t < n; ++t) {
    h ^= h >> 31;
    h *= 0x94d049bb133111ebull;
    h ^= h >> 29;
    ids[t] = static_cast<int32_t>(h % static_cast<uint64_t>(vocab));
  }
  return ids;
}

// Tokens in flight beyond which the caches are not filled by real prefill steps but taken
// as already holding `context` positions of zeros: a decode step costs the same whatever
// the cached values are, and a batch of 128 x 4k real prefill would take minutes.
constexpr int64_t kMaxPrefillFillTokens = 32768;

std::vector<OpFigure> op_figures(const OpProfile& p, int steps) {
  std::vector<OpFigure> v;
  for (const OpStat& s : p.sorted())
    v.push_back({s.op, static_cast<double>(s.calls) / steps, 1e3 * s.seconds / steps, s.bytes / steps, s.flops / steps});
  return v;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

struct Seq {
  std::vector<int32_t> pages;
  int n_past = 0;
  int32_t last = 0;
};

// A fresh sequence in state slot `slot` takes `prompt` in steps of at most `chunk` tokens
// (the server's chunked prefill); the last step samples one token into out.
Status prefill_chunked(StepRunner& runner, const std::vector<int32_t>& prompt, int slot,
                       const std::vector<int32_t>& pages, int chunk, StepOutput& out) {
  SamplingParams greedy;
  greedy.temperature = 0;
  const int n = static_cast<int>(prompt.size());
  for (int done = 0; done < n;) {
    const int take = std::min(chunk, n - done);
    StepInput in;
    if (done == 0) in.before.push_back({-1, slot});
    StepSeq s;
    s.new_token_ids = std::span<const int32_t>(prompt).subspan(done, take);
    s.n_past = done;
    s.state_slot = slot;
    s.pages = pages;
    s.sample = done + take == n;
    in.seqs.push_back(s);
    if (s.sample) SequenceSampler(greedy, 0, {}).add_row(in.sampling, 0, {});
    MR_RETURN_IF_ERROR(runner.step(in, out));
    done += take;
  }
  return Status::ok();
}

}  // namespace

double prompt_attention_flops(const ModelConfig& c, int64_t n) {
  // Causal: query i meets i + 1 keys, n(n + 1)/2 pairs a head; a pair costs the score (2 dqk)
  // and the weighted value (2 v).
  const double pairs = static_cast<double>(n) * (n + 1) / 2;
  return pairs * c.num_mla_layers * c.num_attention_heads * 2.0 * (c.mla_q_head_dim() + c.v_head_dim);
}

std::optional<PeerFigures> k3_slice_peer(const ModelConfig& c) {
  if (c.hidden_size != 7168 || c.num_experts != 896 || c.num_hidden_layers != 3) return std::nullopt;
  PeerFigures p;
  p.source = "llama.cpp Kimi K3 port (CUDA, flash attention), one H200, 3-layer K3-width slice, 4k context "
             "(issue #12)";
  p.decode_tok_s = {{1, 336}, {8, 1463}, {32, 1303}, {128, 1546}};
  p.floor_tok_s = {{1, 573}, {8, 3064}, {32, 6565}, {128, 15390}};
  p.prefill_tok_s = 5366;
  return p;
}

StepBytes decode_step_bytes(const ModelConfig& c, int64_t weight_bytes, bool bf16_weights, const CacheLayout& layout,
                            int batch, int context, double* expected_experts) {
  const double wbytes = bf16_weights ? 2.0 : 4.0;
  int moe_layers = 0;
  for (const LayerSpec& l : c.layers) moe_layers += l.mlp == MlpKind::moe ? 1 : 0;
  const double expert_elems = 3.0 * c.moe_intermediate_size * c.expert_io_dim();
  // MXFP4: 4 bits and an E8M0 byte per 32; K2's INT4: 4 bits and a bf16 scale per 32.
  const double scale_bytes = c.expert_quant == ExpertQuant::int4_g32_sym ? 2.0 : 1.0;
  const double per_expert =
      c.expert_quant == ExpertQuant::none ? expert_elems * wbytes : expert_elems * (0.5 + scale_bytes / 32);
  const double all_experts = static_cast<double>(moe_layers) * c.num_experts * per_expert;
  // The embedding table is read one row per token (unless it is also the lm_head).
  const double table = c.tie_word_embeddings ? 0.0 : static_cast<double>(c.vocab_size) * c.hidden_size * wbytes;
  StepBytes b;
  b.dense = std::max(0.0, static_cast<double>(weight_bytes) - table - all_experts) + batch * c.hidden_size * wbytes;
  // Distinct experts among batch x top-k uniform draws without replacement per token.
  const double E = c.num_experts, K = c.num_experts_per_token;
  const double distinct = E > 0 ? E * (1.0 - std::pow(1.0 - K / E, batch)) : 0.0;
  if (expected_experts) *expected_experts = distinct;
  b.experts = moe_layers * distinct * per_expert;
  // The cache a token reads: every row of a gated-MLA layer; in a DSA layer (K3.1) every
  // indexer key but only its index_topk selected latent rows (moonrun's indexer pool is F32).
  const int dsa = c.num_dsa_layers;
  const double index_per_token = static_cast<double>(dsa) * c.dsa.index_head_dim * 4.0;
  const double latent_per_layer =
      c.num_mla_layers > 0 ? (static_cast<double>(layout.kv_bytes_per_token) - index_per_token) / c.num_mla_layers : 0.0;
  const double selected = std::min<double>(context, dsa > 0 ? c.dsa.index_topk : context);
  b.kv_cache = static_cast<double>(batch) * ((c.num_mla_layers - dsa) * context * latent_per_layer +
                                             dsa * selected * latent_per_layer + context * index_per_token);
  b.state = 2.0 * batch * layout.state_bytes_per_slot;
  return b;
}

double decode_step_flops(const ModelConfig& c, const StepBytes& bytes, bool bf16_weights, int batch, int tokens_each,
                         int context) {
  const double wbytes = bf16_weights ? 2.0 : 4.0;
  const double tokens = static_cast<double>(batch) * tokens_each;
  // bytes.dense counts the batch's embedding rows beside the weights: not multiplied.
  const double dense_params = std::max(0.0, bytes.dense - batch * c.hidden_size * wbytes) / wbytes;
  int moe_layers = 0;
  for (const LayerSpec& l : c.layers) moe_layers += l.mlp == MlpKind::moe ? 1 : 0;
  const double expert_params = 3.0 * c.moe_intermediate_size * c.expert_io_dim();
  const double linear = 2.0 * tokens * (dense_params + static_cast<double>(moe_layers) * c.num_experts_per_token * expert_params);
  // Each token sees the context plus the tokens before it in its own step (at most k more);
  // in a DSA layer it attends to index_topk of them and scores all of them with the
  // indexer (heads x head_dim multiply-adds a key, and the weighted sum over heads).
  const double seen = context + (tokens_each - 1) / 2.0;
  const int dsa = c.num_dsa_layers;
  const double attended = dsa > 0 ? std::min<double>(seen, c.dsa.index_topk) : seen;
  const double per_key = c.num_attention_heads * 2.0 * (c.mla_cache_row() + c.kv_lora_rank);
  const double attention = tokens * per_key * ((c.num_mla_layers - dsa) * seen + dsa * attended);
  const double indexer = tokens * seen * dsa * 2.0 * c.dsa.index_n_heads * (c.dsa.index_head_dim + 1.0);
  return linear + attention + indexer;
}

Result<ModelBenchReport> run_model_bench(const ModelBenchConfig& c) {
  if (c.batches.empty()) return invalid_argument("--batch: at least one batch size");
  for (int b : c.batches)
    if (b < 1) return invalid_argument("--batch: sizes must be >= 1, got " + std::to_string(b));
  if (c.context_tokens < 1 || c.decode_steps < 1 || c.warmup_steps < 0 || c.profile_steps < 1)
    return invalid_argument("--context, --steps and --profile-steps must be >= 1, --warmup >= 0");
  const int max_batch = *std::max_element(c.batches.begin(), c.batches.end());
  int max_drafts = 0;
  for (int k : c.draft_tokens) {
    if (k < 1 || k >= kShortSeqMaxNewTokens)
      return invalid_argument("--draft-tokens: each k in [1, " + std::to_string(kShortSeqMaxNewTokens - 1) + "]");
    max_drafts = std::max(max_drafts, k);
  }
  const int per_seq = c.context_tokens + c.warmup_steps + c.decode_steps + c.profile_steps + 1 + max_drafts;
  if (c.lane_chunk_tokens < 0 || c.lane_chunks < 1) return invalid_argument("--lane-chunk must be >= 0");
  const bool lane_rows = c.lane_chunk_tokens > 0;
  RuntimeOptions ro = c.runtime;
  ro.num_speculative_tokens = max_drafts;
  // --lane-chunk: the lane's sequence takes the slot after the batch's.
  ro.max_running_requests = max_batch + (lane_rows ? 1 : 0);
  if (lane_rows) ro.prefill_lane_tokens = c.lane_chunk_tokens;
  ro.prefix_cache = false;
  ro.page_size_tokens = ro.page_size_tokens > 0 ? ro.page_size_tokens : 16;
  const int ps = ro.page_size_tokens;
  // A sequence of a row with k drafts holds its context, one token a step and the k drafts
  // of its last step; its pages lie at [i * pages_each, (i + 1) * pages_each). The prefill
  // row's one prompt takes pages from 0.
  const auto tokens_each = [&](int k) -> int64_t {
    return static_cast<int64_t>(c.context_tokens) + c.warmup_steps + c.decode_steps + c.profile_steps + 1 + k;
  };
  const auto pages_each = [&](int k) -> int64_t { return (tokens_each(k) + ps - 1) / ps; };
  const int64_t prefill_pages = (static_cast<int64_t>(c.prefill_tokens) + ps - 1) / ps;
  // --lane-chunk: the lane's prompt (context + one chunk) on pages after the largest batch's.
  const int64_t lane_pages = lane_rows ? (int64_t{c.context_tokens} + c.lane_chunk_tokens + ps - 1) / ps : 0;
  // The pool need not hold more than the largest row; --max-total-tokens may cap it lower
  // (and so may the device's memory): rows that do not fit are skipped, not run.
  const int64_t pages_wanted =
      std::max<int64_t>(int64_t{max_batch} * pages_each(max_drafts) + lane_pages, prefill_pages);
  ro.max_total_tokens = pages_wanted * ps;
  if (c.runtime.max_total_tokens > 0) ro.max_total_tokens = std::min(ro.max_total_tokens, c.runtime.max_total_tokens);
  const bool prefill_fill = static_cast<int64_t>(max_batch) * c.context_tokens <= kMaxPrefillFillTokens;
  // Prompts go through in chunks of --chunked-prefill-size, as `serve` feeds them: the
  // step's memory is a chunk's, whatever the prompt's length.
  const int chunk = ro.max_tokens_per_step > 0 ? ro.max_tokens_per_step : defaults::kChunkedPrefillTokens;
  ro.max_tokens_per_step = std::max(chunk, max_batch);
  if (c.prefill_tokens < 0) return invalid_argument("--prefill must be >= 0");
  const int64_t longest =
      std::max<int64_t>({per_seq, c.prefill_tokens, lane_rows ? int64_t{c.context_tokens} + c.lane_chunk_tokens : 0});
  if (ro.context_length > 0 && longest > ro.context_length)
    return invalid_argument("--prefill / --context: " + std::to_string(longest) + " tokens, over --context-length " +
                            std::to_string(ro.context_length));
  // The pools hold the longest sequence, in whole pages (the CPU sizes its pool by it).
  if (ro.context_length == 0) ro.context_length = (longest + ps - 1) / ps * ps;

  ModelBenchReport report;
  const std::string device = resolve_device(ro.device);
  if (device == "cuda") {
    // Before the model takes the memory: the copy and GEMM buffers live outside the arena.
    const DevicePeakFigures peaks = MR_TRY(measure_device_peaks(ro.cuda_device));
    report.copy_gb_s = peaks.copy_gb_s;
    report.bf16_tflops = peaks.bf16_tflops;
    const std::vector<GpuDescription> gpus = visible_gpus();
    if (ro.cuda_device < static_cast<int>(gpus.size())) report.gpu = gpus[ro.cuda_device].name;
    if (c.kernels) {  // on a backend of its own, freed before the model loads
      nlohmann::json peers;
      if (!c.kernel_peers_json.empty()) {
        std::ifstream in(c.kernel_peers_json);
        if (!in) return invalid_argument("--kernel-peers: cannot read " + c.kernel_peers_json);
        peers = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
        if (peers.is_discarded()) return invalid_argument("--kernel-peers: " + c.kernel_peers_json + " is not JSON");
      }
      RuntimeOptions ko = ro;
      ko.mem_fraction_static = 0.2;
      auto ops = MR_TRY(make_device_ops(ko));
      report.kernels = MR_TRY(run_k3_kernel_bench(*ops, peers));
    }
  } else if (c.kernels) {
    return invalid_argument("--kernels: the kernel comparisons need --device cuda");
  }
  Runtime rt = MR_TRY(build_runtime(c.model, ro));
  StepRunner& runner = *rt.runner;
  const int vocab = rt.config.vocab_size;

  report.model = c.model;
  report.device = rt.device;
  report.dtype = rt.dtype_name;
  report.kv_dtype = rt.kv_dtype_name;
  report.date = utc_now();
  report.commit = c.commit;
  report.weight_bytes = static_cast<double>(rt.weight_bytes);
  report.cuda_graphs = rt.device == "cuda" && ro.cuda_graphs;
  report.context_tokens = c.context_tokens;
  report.caches_prefilled = prefill_fill;
  report.tp_size = ro.tp_size;
  report.ep_size = ro.ep_size;
  report.standin_collective_us = ro.standin_collective_us;
  report.mla_layers = rt.config.num_mla_layers;
  // The floor and the one-GPU peer figures are a single device's: at TP > 1 the per-op
  // table (rank 0's) and the collectives say where the time goes instead.
  if (ro.tp_size == 1) report.peer = k3_slice_peer(rt.config);
  auto* group = dynamic_cast<ParallelRunner*>(rt.runner.get());
  if (group && ro.standin_collective_us < 0) {
    std::vector<Ops*> ranks;
    for (int r = 0; r < group->size(); ++r) ranks.push_back(&group->rank(r).ops());
    bool moe = false;
    for (const LayerSpec& l : rt.config.layers) moe |= l.mlp == MlpKind::moe;
    report.collectives = MR_TRY(
        run_collective_bench(ranks, rt.config.hidden_size, moe ? rt.config.expert_io_dim() : 0, c.batches));
  }
  SamplingParams greedy;
  greedy.temperature = 0;
  StepOutput out;
  OpProfile profile;

  // What a row needs of the pools against what they hold (issue #38: 8 sequences of 1M
  // tokens on an 80 GB H100 ran into "KV page ... is not in the pool" mid-bench). The KV
  // pages and K3.1's DSA indexer-key pages share their ids: one count covers both.
  const CacheConfig& pool = rt.cache;
  const bool has_kv = pool.layout.kv_bytes_per_token > 0;
  const bool has_state = pool.layout.state_bytes_per_slot > 0;
  const std::string pool_words = [&] {
    char buf[256];
    std::snprintf(buf, sizeof buf, "%d pages (%.2f GB at %lld bytes a token%s, sized from %s)", pool.num_pages,
                  pool.kv_bytes() / 1e9, static_cast<long long>(pool.layout.kv_bytes_per_token),
                  rt.config.num_dsa_layers > 0 ? " with the DSA indexer keys" : "",
                  c.runtime.max_total_tokens > 0 && pool.num_pages >= (c.runtime.max_total_tokens + ps - 1) / ps
                      ? "--max-total-tokens"
                      : "the device's memory");
    return std::string(buf);
  }();
  const std::string more_room = " or give the pool more room (--kv-cache-dtype fp8, --mem-fraction-static" +
                                std::string(c.runtime.max_total_tokens > 0 ? ", --max-total-tokens)" : ")");
  // Empty when the row fits; else the row's SkippedRow.
  const auto misfit = [&](int b, int k) -> std::optional<SkippedRow> {
    SkippedRow r;
    r.kind = k > 0 ? "verify" : "decode";
    r.batch = b;
    r.draft_tokens = k;
    r.tokens_each = tokens_each(k);
    r.pages_needed = int64_t{b} * pages_each(k);
    r.pages_held = pool.num_pages;
    std::string row = (k > 0 ? "verify k " + std::to_string(k) + ", " : std::string("decode ")) + "batch " +
                      std::to_string(b) + " x context " + std::to_string(c.context_tokens);
    if (has_kv && r.pages_needed > r.pages_held) {
      r.message = row + ": skipped: " + std::to_string(b) + " sequences x " + std::to_string(pages_each(k)) +
                  " KV pages (" + std::to_string(r.tokens_each) + " tokens each: context + steps" +
                  (k > 0 ? " + drafts" : "") + ", " + std::to_string(ps) + " a page) = " +
                  std::to_string(r.pages_needed) + " pages; the pool holds " + pool_words +
                  "; lower --batch or --context," + more_room;
      return r;
    }
    if (has_state && (b > pool.num_state_slots || (k > 0 && b > pool.num_verify_slots))) {
      r.message = row + ": skipped: " + std::to_string(b) + " sequences need " + std::to_string(b) +
                  " state slots" + (k > 0 ? " and as many verify slots" : "") + "; the pool holds " +
                  std::to_string(pool.num_state_slots) + " and " + std::to_string(pool.num_verify_slots) +
                  "; lower --batch";
      return r;
    }
    return std::nullopt;
  };

  // One batch size's steps: decode (k = 0) or verify steps of 1 + k tokens a sequence whose
  // drafts are all rejected (each step starts with the rollback of the one before).
  const auto run_batch = [&](int b, int k) -> Result<DecodeFigure> {
    // Fresh sequences: slot i, pages [i * each, (i + 1) * each) (misfit checked they exist).
    const int each = static_cast<int>(pages_each(k));
    std::vector<Seq> seqs(b);
    for (int i = 0; i < b; ++i) {
      for (int p = 0; p < each; ++p) seqs[i].pages.push_back(i * each + p);
      seqs[i].n_past = c.context_tokens;
      seqs[i].last = tokens_of(i, 1, vocab, c.seed + 7)[0];
      if (!prefill_fill) continue;
      const std::vector<int32_t> prompt = tokens_of(i, c.context_tokens, vocab, c.seed);
      MR_RETURN_IF_ERROR(prefill_chunked(runner, prompt, i, seqs[i].pages, chunk, out));
      seqs[i].last = out.samples[0].token;
    }
    const int total_steps = c.warmup_steps + c.decode_steps + (c.profile ? c.profile_steps : 0);
    double timed_s = 0;
    bool profiling = false;
    for (int step = 0; step < total_steps; ++step) {
      if (c.profile && step == c.warmup_steps + c.decode_steps) {
        profile.clear();
        profiling = runner.set_op_profile(&profile);
        if (!profiling) break;
      }
      StepInput in;
      if (step == 0 && !prefill_fill)
        for (int i = 0; i < b; ++i) in.before.push_back({-1, i});  // a clean state; the KV rows stay zero
      std::vector<std::vector<int32_t>> tokens(b);
      for (int i = 0; i < b; ++i) {
        tokens[i] = {seqs[i].last};
        for (int j = 0; j < k; ++j) tokens[i].push_back((seqs[i].last + 1 + j) % vocab);
        StepSeq s;
        s.new_token_ids = tokens[i];
        s.n_past = seqs[i].n_past;
        s.state_slot = i;
        s.pages = seqs[i].pages;
        s.sample = true;
        s.n_draft = k;
        in.seqs.push_back(s);
        for (int j = 0; j <= k; ++j) SequenceSampler(greedy, 0, {}).add_row(in.sampling, 0, {});
        if (k > 0) {
          const int verify_slot = rt.cache.total_slots() + i;
          if (step > 0) in.replays.push_back({i, verify_slot, i * (1 + k), 1});
          in.before.push_back({i, verify_slot});
        }
      }
      const auto t0 = std::chrono::steady_clock::now();
      MR_RETURN_IF_ERROR(runner.step(in, out));
      if (step >= c.warmup_steps && !profiling) timed_s += seconds_since(t0);
      // The next token: a fresh pseudo-random one per sequence and step, not the model's
      // greedy choice. On a slice's synthetic weights the greedy tokens of a batch collapse
      // onto a few ids (the caches hold zero rows, so a token's hidden state is its
      // embedding's), and a batch of equal tokens routes to the same experts: at batch 128 a
      // K2.7-width slice read ~56 experts a layer where the floor counts ~358.
      for (int i = 0; i < b; ++i) {
        seqs[i].n_past += 1;
        seqs[i].last = tokens_of(i, 1, vocab, c.seed + 1009 + static_cast<uint64_t>(step))[0];
      }
    }
    DecodeFigure f;
    f.batch = b;
    f.draft_tokens = k;
    f.step_ms = 1e3 * timed_s / c.decode_steps;
    f.tok_s = b * c.decode_steps / timed_s;
    if (ro.tp_size == 1)  // one device's bytes (rt.weight_bytes is one rank's)
      f.bytes = decode_step_bytes(rt.config, rt.weight_bytes, rt.dtype_name == "bfloat16", rt.cache.layout, b,
                                  c.context_tokens, &f.expected_experts);
    if (ro.tp_size == 1)
      f.flops = decode_step_flops(rt.config, f.bytes, rt.dtype_name == "bfloat16", b, 1 + k, c.context_tokens);
    if (report.copy_gb_s > 0 && ro.tp_size == 1) {
      // The floor is the slower of moving the step's bytes and computing its FLOPs.
      const double bytes_s = f.bytes.total() / (report.copy_gb_s * 1e9);
      const double flops_s = report.bf16_tflops > 0 ? f.flops / (report.bf16_tflops * 1e12) : 0.0;
      f.floor_binds = flops_s > bytes_s ? "flops" : "bytes";
      f.floor_tok_s = b / std::max(bytes_s, flops_s);
      f.floor_ratio = f.tok_s / f.floor_tok_s;
    }
    if (profiling) {
      runner.set_op_profile(nullptr);
      f.ops = op_figures(profile, c.profile_steps);
      f.profiled_step_ms = 1e3 * profile.total_seconds() / c.profile_steps;
      // The experts the profiled steps really read (ProfiledOps counts each call's distinct
      // experts), per MoE layer: beside the floor's expectation for a uniform router.
      int moe_layers = 0;
      for (const LayerSpec& l : rt.config.layers) moe_layers += l.mlp == MlpKind::moe ? 1 : 0;
      const ModelConfig& mc = rt.config;
      const double expert_elems = 3.0 * mc.moe_intermediate_size * mc.expert_io_dim();
      const double scale_bytes = mc.expert_quant == ExpertQuant::int4_g32_sym ? 2.0 : 1.0;
      const double per_expert = mc.expert_quant == ExpertQuant::none
                                    ? expert_elems * (rt.dtype_name == "bfloat16" ? 2.0 : 4.0)
                                    : expert_elems * (0.5 + scale_bytes / 32);
      double expert_bytes = 0;
      for (const OpFigure& o : f.ops)
        if (o.op.rfind("moe_experts", 0) == 0) expert_bytes += o.bytes;  // per step, x and y included
      if (moe_layers > 0 && per_expert > 0)
        f.profiled_experts = expert_bytes / moe_layers / per_expert;
    }
    return f;
  };
  const auto run_row = [&](int b, int k) -> Status {
    if (std::optional<SkippedRow> skip = misfit(b, k)) {
      report.skipped.push_back(std::move(*skip));
      return Status::ok();
    }
    (k > 0 ? report.verify : report.decode).push_back(MR_TRY(run_batch(b, k)));
    return Status::ok();
  };
  for (int b : c.batches) MR_RETURN_IF_ERROR(run_row(b, 0));
  for (int k : c.draft_tokens)
    for (int b : c.batches) MR_RETURN_IF_ERROR(run_row(b, k));
  double tok_s_b1 = 0;
  for (const DecodeFigure& f : report.decode)
    if (f.batch == 1) tok_s_b1 = f.tok_s;
  for (DecodeFigure& f : report.decode) f.speedup_vs_b1 = tok_s_b1 > 0 ? f.tok_s / tok_s_b1 : 0;

  // --lane-chunk: decode steps of each batch size while a chunk runs on the prefill lane,
  // against each alone. The decode steps repeat one position (each writes the same cache
  // row) and the chunk one span of its prompt: the same work every time.
  PrefillLane* lane = lane_rows ? runner.prefill_lane() : nullptr;
  if (lane_rows && !lane) return failed_precondition("--lane-chunk: this runner has no prefill lane");
  for (int b : lane_rows ? c.batches : std::vector<int>{}) {
    if (std::optional<SkippedRow> skip = misfit(b, 0)) {
      skip->kind = "lane";
      report.skipped.push_back(std::move(*skip));
      continue;
    }
    const int64_t lane_first_page = int64_t{max_batch} * pages_each(max_drafts);
    if (has_kv && lane_first_page + lane_pages > pool.num_pages) {
      SkippedRow r;
      r.kind = "lane";
      r.batch = b;
      r.tokens_each = int64_t{c.context_tokens} + c.lane_chunk_tokens;
      r.pages_needed = lane_first_page + lane_pages;
      r.pages_held = pool.num_pages;
      r.message = "decode beside a lane chunk, batch " + std::to_string(b) + ": skipped: the batches' pages and the " +
                  "lane prompt's " + std::to_string(lane_pages) + " need " + std::to_string(r.pages_needed) +
                  " pages; the pool holds " + pool_words + "; lower --context or --lane-chunk," + more_room;
      report.skipped.push_back(std::move(r));
      continue;
    }
    const int each = static_cast<int>(pages_each(0));
    std::vector<Seq> seqs(b);
    for (int i = 0; i < b; ++i) {
      for (int p = 0; p < each; ++p) seqs[i].pages.push_back(i * each + p);
      seqs[i].n_past = c.context_tokens;
    }
    const int lane_slot = max_batch;
    std::vector<int32_t> lane_page_ids;
    for (int64_t p = 0; p < lane_pages; ++p) lane_page_ids.push_back(static_cast<int32_t>(lane_first_page + p));
    const std::vector<int32_t> chunk_tokens = tokens_of(4242, c.lane_chunk_tokens, vocab, c.seed);
    StepInput chunk_in;
    chunk_in.before.push_back({-1, lane_slot});
    StepSeq cs;
    cs.new_token_ids = chunk_tokens;
    cs.n_past = c.context_tokens;
    cs.state_slot = lane_slot;
    cs.pages = lane_page_ids;
    chunk_in.seqs.push_back(cs);
    StepOutput chunk_out;
    int step_no = 0;
    std::vector<std::vector<int32_t>> tokens(b);
    const auto decode_step = [&]() -> Status {
      StepInput in;
      if (step_no == 0)
        for (int i = 0; i < b; ++i) in.before.push_back({-1, i});
      for (int i = 0; i < b; ++i) {
        tokens[i] = {tokens_of(i, 1, vocab, c.seed + 3001 + static_cast<uint64_t>(step_no))[0]};
        StepSeq s;
        s.new_token_ids = tokens[i];
        s.n_past = seqs[i].n_past;
        s.state_slot = i;
        s.pages = seqs[i].pages;
        s.sample = true;
        in.seqs.push_back(s);
        SequenceSampler(greedy, 0, {}).add_row(in.sampling, 0, {});
      }
      ++step_no;
      return runner.step(in, out);
    };
    const auto run_chunk = [&]() -> Status {
      lane->submit(&chunk_in, &chunk_out);
      return lane->take();
    };
    LaneFigure f;
    f.batch = b;
    f.chunk_tokens = c.lane_chunk_tokens;
    f.chunk_context = c.context_tokens;
    // Alone: the decode steps, then the chunk (one untimed of each first).
    for (int s = 0; s < c.warmup_steps + 1; ++s) MR_RETURN_IF_ERROR(decode_step());
    auto t0 = std::chrono::steady_clock::now();
    for (int s = 0; s < c.decode_steps; ++s) MR_RETURN_IF_ERROR(decode_step());
    f.decode_ms_alone = 1e3 * seconds_since(t0) / c.decode_steps;
    MR_RETURN_IF_ERROR(run_chunk());
    chunk_in.before.clear();
    t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < c.lane_chunks; ++r) MR_RETURN_IF_ERROR(run_chunk());
    f.chunk_ms_alone = 1e3 * seconds_since(t0) / c.lane_chunks;
    // Beside: decode steps back to back for as long as each chunk runs.
    double chunk_s = 0, decode_s = 0;
    int64_t beside = 0;
    for (int r = 0; r < c.lane_chunks; ++r) {
      const auto c0 = std::chrono::steady_clock::now();
      lane->submit(&chunk_in, &chunk_out);
      do {
        const auto d0 = std::chrono::steady_clock::now();
        MR_RETURN_IF_ERROR(decode_step());
        decode_s += seconds_since(d0);
        ++beside;
      } while (!lane->wait_for(std::chrono::microseconds(0)));
      chunk_s += seconds_since(c0);
      MR_RETURN_IF_ERROR(lane->take());
    }
    f.chunk_ms_beside = 1e3 * chunk_s / c.lane_chunks;
    f.decode_ms_beside = 1e3 * decode_s / static_cast<double>(beside);
    f.decode_steps_per_chunk = static_cast<double>(beside) / c.lane_chunks;
    report.lane.push_back(f);
  }

  bool prefill_fits = true;
  if (c.prefill_tokens > 0 && has_kv && prefill_pages > pool.num_pages) {
    prefill_fits = false;
    SkippedRow r;
    r.kind = "prefill";
    r.batch = 1;
    r.tokens_each = c.prefill_tokens;
    r.pages_needed = prefill_pages;
    r.pages_held = pool.num_pages;
    r.message = "prefill of " + std::to_string(c.prefill_tokens) + " tokens: skipped: " +
                std::to_string(prefill_pages) + " KV pages (" + std::to_string(ps) +
                " tokens a page); the pool holds " + pool_words + "; lower --prefill," + more_room;
    report.skipped.push_back(std::move(r));
  }
  if (c.prefill_tokens > 0 && prefill_fits) {
    const std::vector<int32_t> prompt = tokens_of(999, c.prefill_tokens, vocab, c.seed);
    std::vector<int32_t> pages(prefill_pages);
    for (int p = 0; p < prefill_pages; ++p) pages[p] = p;
    const auto prefill_once = [&]() -> Status { return prefill_chunked(runner, prompt, 0, pages, chunk, out); };
    const auto t0 = std::chrono::steady_clock::now();
    MR_RETURN_IF_ERROR(prefill_once());
    report.prefill_tokens = c.prefill_tokens;
    report.prefill_chunk_tokens = chunk;
    report.prefill_s = seconds_since(t0);
    report.prefill_tok_s = c.prefill_tokens / report.prefill_s;
    report.prefill_attention_flops = prompt_attention_flops(rt.config, c.prefill_tokens);
    // The per-op table repeats the prefill op by op: for one chunk's worth of prompt only
    // (a 1M-token prompt would run twice as long again).
    if (c.profile && c.prefill_tokens <= chunk && (profile.clear(), runner.set_op_profile(&profile))) {
      const Status st = prefill_once();
      runner.set_op_profile(nullptr);
      MR_RETURN_IF_ERROR(st);
      report.prefill_ops = op_figures(profile, 1);
      double flops = 0;
      for (const OpFigure& o : report.prefill_ops) flops += o.flops;
      report.prefill_tflops = flops / report.prefill_s / 1e12;
      if (report.bf16_tflops > 0) report.prefill_peak_ratio = report.prefill_tflops / report.bf16_tflops;
    }
  }
  if (report.decode.empty() && report.verify.empty() && report.prefill_tokens == 0) {
    std::string all = "no row fits the cache pools:";
    for (const SkippedRow& r : report.skipped) all += "\n  " + r.message;
    return resource_exhausted(all);
  }
  return report;
}

namespace {

double peer_at(const std::vector<std::pair<int, double>>& v, int batch) {
  for (const auto& [b, x] : v)
    if (b == batch) return x;
  return 0;
}

std::string ops_table(const std::vector<OpFigure>& ops, double step_ms, double copy_gb_s, double tflops) {
  std::string s;
  char line[512];
  s += "| op | calls | ms | % of ops | MB moved | GB/s | / copy bw | TFLOP/s |\n|---|---:|---:|---:|---:|---:|---:|---:|\n";
  double total = 0;
  for (const OpFigure& o : ops) total += o.ms;
  for (const OpFigure& o : ops) {
    const double gbs = o.ms > 0 ? o.bytes / (o.ms * 1e-3) / 1e9 : 0;
    const double tf = o.ms > 0 ? o.flops / (o.ms * 1e-3) / 1e12 : 0;
    char bw[32] = "-", rate[64] = "-";
    if (copy_gb_s > 0) std::snprintf(bw, sizeof bw, "%.2f", gbs / copy_gb_s);
    if (o.flops > 0 && tflops > 0) std::snprintf(rate, sizeof rate, "%.1f (%.2f of peak)", tf, tf / tflops);
    else if (o.flops > 0) std::snprintf(rate, sizeof rate, "%.3f", tf);
    std::snprintf(line, sizeof line, "| %s | %.0f | %.3f | %.1f | %.1f | %.0f | %s | %s |\n", o.op.c_str(), o.calls,
                  o.ms, total > 0 ? 100 * o.ms / total : 0, o.bytes / 1e6, gbs, bw, rate);
    s += line;
  }
  std::snprintf(line, sizeof line, "| **sum of ops** (each timed alone, eager) | | %.3f | 100 | | | | |\n", total);
  s += line;
  if (step_ms > 0) {
    std::snprintf(line, sizeof line, "| real step (as timed above) | | %.3f | | | | | |\n", step_ms);
    s += line;
  }
  return s;
}

}  // namespace

std::string format_model_bench(const ModelBenchReport& r) {
  std::string s;
  char line[512];
  std::snprintf(line, sizeof line, "moonrun bench-model: %s on %s%s%s (%s, KV cache %s, CUDA graphs %s), %d tokens of context%s\n",
                r.model.c_str(), r.device.c_str(), r.gpu.empty() ? "" : " ", r.gpu.c_str(), r.dtype.c_str(),
                r.kv_dtype.c_str(),
                r.cuda_graphs ? "on" : "off", r.context_tokens,
                r.caches_prefilled ? " (prefilled)" : " (positions only: cached rows are zeros)");
  s += line;
  std::snprintf(line, sizeof line, "commit %s, %s; weights on the device %.2f GB\n", r.commit.c_str(), r.date.c_str(),
                r.weight_bytes / 1e9);
  s += line;
  if (r.copy_gb_s > 0) {
    std::snprintf(line, sizeof line,
                  "measured in this run: copy bandwidth %.0f GB/s (device-to-device, read + write), bf16 GEMM %.0f "
                  "TFLOP/s (8192^3, cuBLASLt)\n",
                  r.copy_gb_s, r.bf16_tflops);
    s += line;
  }
  if (r.tp_size > 1) {
    // A group: rank 0's ops in the per-op tables, the collectives timed alone; no floor.
    std::snprintf(line, sizeof line,
                  "tensor-parallel group in this process: TP %d, EP %d, one rank a device (no floor: it is one "
                  "device's; the per-op tables are rank 0's)\n",
                  r.tp_size, r.ep_size);
    s += line;
    if (r.standin_collective_us >= 0) {
      std::snprintf(line, sizeof line,
                    "stand-in collectives: rank 0 of the group alone on one device, its shard of every kernel, each "
                    "collective a wait of %.1f us (timing only: the outputs are not the group's)\n",
                    r.standin_collective_us);
      s += line;
    }
    if (r.collectives) s += "\n" + format_collective_bench(*r.collectives);
    s += "\n| batch | step (ms) | tok/s | vs b=1 |\n|---:|---:|---:|---:|\n";
    for (const DecodeFigure& f : r.decode) {
      std::snprintf(line, sizeof line, "| %d | %.3f | %.1f | %.2fx |\n", f.batch, f.step_ms, f.tok_s,
                    f.speedup_vs_b1);
      s += line;
    }
  } else {
    s += "floor = max(the bytes a step must move (dense weights once + expected distinct experts + KV rows + KDA "
         "state read and written) / copy bandwidth, the FLOPs it must compute (weights x tokens + MLA attention over "
         "the context) / bf16 GEMM peak); \"binds\" says which\n\n";
  }
  const bool peer = r.peer.has_value();
  if (r.tp_size == 1) {
    s += "| batch | step (ms) | tok/s | vs b=1 | MB/step (dense + experts + kv + state) | experts/layer (profiled) | GFLOP/step | "
         "binds | floor tok/s | achieved / floor";
    s += peer ? " | llama.cpp tok/s | moonrun / llama.cpp | issue's floor tok/s |\n|---:|---:|---:|---:|---|---:|---:|---|---:|---:|---:|---:|---:|\n"
              : " |\n|---:|---:|---:|---:|---|---:|---:|---|---:|---:|\n";
  }
  for (const DecodeFigure& f : r.decode) {
    if (r.tp_size > 1) break;  // printed above, without the floor
    // experts/layer: the floor's (a uniform router's), and in brackets the profiled steps'.
    char experts[48];
    if (f.profiled_experts > 0) std::snprintf(experts, sizeof experts, "%.1f (%.1f)", f.expected_experts, f.profiled_experts);
    else std::snprintf(experts, sizeof experts, "%.1f", f.expected_experts);
    std::snprintf(line, sizeof line,
                  "| %d | %.3f | %.1f | %.2fx | %.1f (%.1f + %.1f + %.1f + %.1f) | %s | %.1f | %s | %.0f | %.2f |",
                  f.batch, f.step_ms, f.tok_s, f.speedup_vs_b1, f.bytes.total() / 1e6, f.bytes.dense / 1e6,
                  f.bytes.experts / 1e6, f.bytes.kv_cache / 1e6, f.bytes.state / 1e6, experts,
                  f.flops / 1e9, f.floor_binds, f.floor_tok_s, f.floor_ratio);
    s += line;
    if (peer) {
      const double p = peer_at(r.peer->decode_tok_s, f.batch);
      std::snprintf(line, sizeof line, " %.0f | %.2f | %.0f |", p, p > 0 ? f.tok_s / p : 0,
                    peer_at(r.peer->floor_tok_s, f.batch));
      s += line;
    }
    s += "\n";
  }
  // Rows that did not fit the pools, in the table where they would have been.
  const auto skipped_rows = [&](const char* kind, bool with_k) {
    for (const SkippedRow& k : r.skipped) {
      if (k.kind != kind) continue;
      if (with_k) std::snprintf(line, sizeof line, "| %d | %d | ", k.draft_tokens, k.batch);
      else std::snprintf(line, sizeof line, "| %d | ", k.batch);
      s += line + k.message + " |\n";
    }
  };
  skipped_rows("decode", false);
  if (!r.lane.empty() || std::any_of(r.skipped.begin(), r.skipped.end(), [](const SkippedRow& k) { return k.kind == "lane"; })) {
    // What a decode step costs beside a long prompt's chunk on the prefill lane, and the chunk
    // beside the decode steps (issue #47: both bars at once need both ratios near 1).
    s += "\ndecode beside a prefill-lane chunk (the chunk's end is seen at the first decode step to end after it)\n"
         "| batch | chunk tokens | chunk's context | decode ms alone | decode ms beside | decode beside / alone | "
         "chunk ms alone | chunk ms beside | chunk beside / alone | decode steps a chunk |\n"
         "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    for (const LaneFigure& f : r.lane) {
      std::snprintf(line, sizeof line, "| %d | %d | %d | %.3f | %.3f | %.2f | %.3f | %.3f | %.2f | %.1f |\n", f.batch,
                    f.chunk_tokens, f.chunk_context, f.decode_ms_alone, f.decode_ms_beside,
                    f.decode_ms_beside / f.decode_ms_alone, f.chunk_ms_alone, f.chunk_ms_beside,
                    f.chunk_ms_beside / f.chunk_ms_alone, f.decode_steps_per_chunk);
      s += line;
    }
    skipped_rows("lane", false);
  }
  for (const SkippedRow& k : r.skipped)
    if (k.kind == "prefill") s += "\n" + k.message + "\n";
  if (r.prefill_tokens > 0) {
    std::snprintf(line, sizeof line, "\nprefill: %d tokens in %.3f s = %.1f tok/s", r.prefill_tokens, r.prefill_s,
                  r.prefill_tok_s);
    s += line;
    if (r.prefill_tflops > 0) {
      std::snprintf(line, sizeof line, ", %.1f TFLOP/s counted = %.2f of the measured bf16 GEMM peak",
                    r.prefill_tflops, r.prefill_peak_ratio);
      s += line;
    }
    if (peer && r.peer->prefill_tok_s > 0) {
      std::snprintf(line, sizeof line, "; llama.cpp %.0f tok/s, moonrun / llama.cpp %.2f", r.peer->prefill_tok_s,
                    r.prefill_tok_s / r.peer->prefill_tok_s);
      s += line;
    }
    s += "\n";
    if (r.prefill_attention_flops > 0) {
      const double tf = r.prefill_attention_flops / r.prefill_s / 1e12;
      std::snprintf(line, sizeof line,
                    "prefill in chunks of %d tokens; causal attention of the prompt %.3g PFLOP (%d MLA layers): "
                    "%.1f TFLOP/s over the whole prefill",
                    r.prefill_chunk_tokens, r.prefill_attention_flops / 1e15, r.mla_layers, tf);
      s += line;
      if (r.bf16_tflops > 0) {
        std::snprintf(line, sizeof line, " = %.2f of the measured bf16 GEMM peak", tf / r.bf16_tflops);
        s += line;
      }
      s += "\n";
    }
  }
  if (peer) s += "peer: " + r.peer->source + "\n";
  if (!r.kernels.empty()) s += format_kernel_bench(r.kernels, r.copy_gb_s);
  if (!r.verify.empty()) {
    // What a verify step costs against the decode step it replaces, and what one stream gets
    // at the peers' published acceptance lengths on K3 (vLLM's DSpark blog, 2026-07-27:
    // 2.61 tokens a step on creative writing, 4.73 on code), with the rollback every step.
    s += "\nspeculative verify steps (last token + k drafts a sequence, all rejected: a rollback every step):\n";
    s += "| k | batch | verify step (ms) | decode step (ms) | verify / decode | tok/s at 2.61 | tok/s at 4.73 | "
         "vs decode at 2.61 | vs decode at 4.73 |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    for (const DecodeFigure& v : r.verify) {
      double decode_ms = 0;
      for (const DecodeFigure& d : r.decode)
        if (d.batch == v.batch) decode_ms = d.step_ms;
      const double lo = std::min(2.61, 1.0 + v.draft_tokens), hi = std::min(4.73, 1.0 + v.draft_tokens);
      const double tok_lo = v.batch * lo / (v.step_ms * 1e-3), tok_hi = v.batch * hi / (v.step_ms * 1e-3);
      const double base = decode_ms > 0 ? v.batch / (decode_ms * 1e-3) : 0;
      std::snprintf(line, sizeof line, "| %d | %d | %.3f | %.3f | %.2f | %.1f | %.1f | %.2f | %.2f |\n", v.draft_tokens,
                    v.batch, v.step_ms, decode_ms, decode_ms > 0 ? v.step_ms / decode_ms : 0, tok_lo, tok_hi,
                    base > 0 ? tok_lo / base : 0, base > 0 ? tok_hi / base : 0);
      s += line;
    }
  }
  if (r.verify.empty() && !r.skipped.empty()) {
    bool any = false;
    for (const SkippedRow& k : r.skipped) any |= k.kind == "verify";
    if (any)
      s += "\nspeculative verify steps:\n| k | batch | |\n|---:|---:|---|\n";
  }
  skipped_rows("verify", true);
  for (const DecodeFigure& f : r.verify) {
    if (f.ops.empty()) continue;
    std::snprintf(line, sizeof line, "\nper-op, verify step k %d, batch %d (profiled step %.3f ms):\n", f.draft_tokens,
                  f.batch, f.profiled_step_ms);
    s += line;
    s += ops_table(f.ops, f.step_ms, r.copy_gb_s, r.bf16_tflops);
  }
  for (const DecodeFigure& f : r.decode) {
    if (f.ops.empty()) continue;
    std::snprintf(line, sizeof line, "\nper-op, decode batch %d (profiled step %.3f ms):\n", f.batch, f.profiled_step_ms);
    s += line;
    s += ops_table(f.ops, f.step_ms, r.copy_gb_s, r.bf16_tflops);
  }
  if (!r.prefill_ops.empty()) {
    std::snprintf(line, sizeof line, "\nper-op, prefill of %d tokens:\n", r.prefill_tokens);
    s += line;
    s += ops_table(r.prefill_ops, 1e3 * r.prefill_s, r.copy_gb_s, r.bf16_tflops);
  }
  return s;
}

namespace {
nlohmann::json ops_json(const std::vector<OpFigure>& ops, double copy_gb_s, double tflops) {
  nlohmann::json a = nlohmann::json::array();
  for (const OpFigure& o : ops) {
    const double gbs = o.ms > 0 ? o.bytes / (o.ms * 1e-3) / 1e9 : 0;
    const double tf = o.ms > 0 ? o.flops / (o.ms * 1e-3) / 1e12 : 0;
    a.push_back({{"op", o.op},
                 {"calls", o.calls},
                 {"ms", o.ms},
                 {"bytes", o.bytes},
                 {"flops", o.flops},
                 {"gb_s", gbs},
                 {"bandwidth_ratio", copy_gb_s > 0 ? gbs / copy_gb_s : 0},
                 {"tflops", tf},
                 {"peak_ratio", tflops > 0 ? tf / tflops : 0}});
  }
  return a;
}
}  // namespace

nlohmann::json model_bench_to_json(const ModelBenchReport& r) {
  nlohmann::json j = {{"model", r.model},
                      {"device", r.device},
                      {"gpu", r.gpu},
                      {"date", r.date},
                      {"commit", r.commit},
                      {"dtype", r.dtype},
                      {"kv_cache_dtype", r.kv_dtype},
                      {"cuda_graphs", r.cuda_graphs},
                      {"context_tokens", r.context_tokens},
                      {"caches_prefilled", r.caches_prefilled},
                      {"copy_tb_s", r.copy_gb_s / 1e3},
                      {"bf16_gemm_tflops", r.bf16_tflops},
                      {"weight_bytes", r.weight_bytes},
                      {"tp_size", r.tp_size},
                      {"ep_size", r.ep_size}};
  if (r.standin_collective_us >= 0) j["standin_collective_us"] = r.standin_collective_us;
  if (r.collectives) j["collectives"] = collective_bench_to_json(*r.collectives);
  j["verify"] = nlohmann::json::array();
  for (const DecodeFigure& f : r.verify) {
    nlohmann::json v = {{"draft_tokens", f.draft_tokens}, {"batch", f.batch}, {"step_ms", f.step_ms},
                        {"profiled_step_ms", f.profiled_step_ms}};
    if (!f.ops.empty()) v["ops"] = ops_json(f.ops, r.copy_gb_s, r.bf16_tflops);
    j["verify"].push_back(v);
  }
  j["decode"] = nlohmann::json::array();
  for (const DecodeFigure& f : r.decode) {
    nlohmann::json d = {{"batch", f.batch},
                        {"step_ms", f.step_ms},
                        {"tok_s", f.tok_s},
                        {"speedup_vs_b1", f.speedup_vs_b1},
                        {"bytes", f.bytes.total()},
                        {"bytes_parts",
                         {{"dense", f.bytes.dense}, {"experts", f.bytes.experts}, {"kv_cache", f.bytes.kv_cache},
                          {"state", f.bytes.state}}},
                        {"expected_experts_per_layer", f.expected_experts},
                        {"profiled_experts_per_layer", f.profiled_experts},
                        {"flops", f.flops},
                        {"floor_tok_s", f.floor_tok_s},
                        {"floor_ratio", f.floor_ratio},
                        {"floor_binds", f.floor_binds},
                        {"profiled_step_ms", f.profiled_step_ms},
                        {"ops", ops_json(f.ops, r.copy_gb_s, r.bf16_tflops)}};
    j["decode"].push_back(d);
  }
  if (r.prefill_tokens > 0) {
    j["prefill"] = {{"tokens", r.prefill_tokens},
                    {"chunk_tokens", r.prefill_chunk_tokens},
                    {"seconds", r.prefill_s},
                    {"tok_s", r.prefill_tok_s},
                    {"tflops", r.prefill_tflops},
                    {"attention_flops", r.prefill_attention_flops},
                    {"attention_peak_ratio", r.bf16_tflops > 0 && r.prefill_s > 0
                                                 ? r.prefill_attention_flops / r.prefill_s / 1e12 / r.bf16_tflops
                                                 : 0.0},
                    {"ops", ops_json(r.prefill_ops, r.copy_gb_s, r.bf16_tflops)}};
    j["prefill_tok_s"] = r.prefill_tok_s;
    j["prefill_peak_ratio"] = r.prefill_peak_ratio;
  }
  if (r.peer) {
    nlohmann::json p = {{"source", r.peer->source}, {"prefill_tok_s", r.peer->prefill_tok_s}};
    p["decode"] = nlohmann::json::array();
    for (const auto& [b, x] : r.peer->decode_tok_s)
      p["decode"].push_back({{"batch", b}, {"tok_s", x}, {"floor_tok_s", peer_at(r.peer->floor_tok_s, b)}});
    j["peer"] = p;
  }
  if (!r.kernels.empty()) j["kernels"] = kernel_bench_to_json(r.kernels, r.copy_gb_s);
  if (!r.lane.empty()) {
    j["beside_lane"] = nlohmann::json::array();
    for (const LaneFigure& f : r.lane)
      j["beside_lane"].push_back({{"batch", f.batch},
                                  {"chunk_tokens", f.chunk_tokens},
                                  {"chunk_context_tokens", f.chunk_context},
                                  {"decode_ms_alone", f.decode_ms_alone},
                                  {"decode_ms_beside", f.decode_ms_beside},
                                  {"chunk_ms_alone", f.chunk_ms_alone},
                                  {"chunk_ms_beside", f.chunk_ms_beside},
                                  {"decode_steps_per_chunk", f.decode_steps_per_chunk}});
  }
  j["skipped"] = nlohmann::json::array();
  for (const SkippedRow& k : r.skipped)
    j["skipped"].push_back({{"kind", k.kind},
                            {"batch", k.batch},
                            {"draft_tokens", k.draft_tokens},
                            {"tokens_each", k.tokens_each},
                            {"pages_needed", k.pages_needed},
                            {"pages_held", k.pages_held},
                            {"message", k.message}});
  return j;
}

}  // namespace moonrun::tools
