#include "runtime/model_runner.h"

#include <algorithm>
#include <optional>
#include <string>

#include "backend/op_profile.h"
#include "common/debug_phases.h"

namespace moonrun {

namespace {

// The logits rows a step gives a sequence: every new token's when it asks for them all or
// verifies drafts, else its last token's.
int logit_rows_of(const StepSeq& s) {
  return s.all_logits || s.n_draft > 0 ? static_cast<int>(s.new_token_ids.size()) : 1;
}

}  // namespace

int decode_bucket(int n_seqs, int max_seqs) {
  int b = 1;
  while (b < n_seqs && b < 8) b *= 2;
  if (n_seqs > 8) b = (n_seqs + 7) / 8 * 8;
  return std::max(n_seqs, std::min(b, std::max(max_seqs, n_seqs)));
}

Result<std::unique_ptr<ModelRunner>> ModelRunner::create(std::unique_ptr<Ops> ops, std::unique_ptr<Model> model,
                                                         const CacheConfig& cache, const RunnerOptions& options) {
  if (!ops || !model) return invalid_argument("ModelRunner::create: no backend or no model");
  std::unique_ptr<ModelRunner> r(new ModelRunner());
  r->cache_ = cache;
  r->options_ = options;
  const CacheSpec spec = model->cache_spec();
  // One more slot and page than the cache manager hands out: padding sequences of a
  // captured decode batch read and write them. Under DP attention a rank holds its page
  // group only (CacheConfig::page_groups; step_dp maps the ids).
  const int groups = std::max(cache.page_groups, 1);
  if (groups > 1 && groups != options.dp_attention_size)
    return invalid_argument("ModelRunner::create: " + std::to_string(groups) + " page groups for " +
                            std::to_string(options.dp_attention_size) + " DP ranks");
  // The same for state slots: a rank holds its own slots (slot mod groups), slot s at s / groups.
  const int slots = (cache.all_slots() + groups - 1) / groups + 1, pages = cache.num_pages / groups + 1;
  r->pad_slot_ = slots - 1;
  r->pad_page_ = pages - 1;
  try {
    if (spec.state_floats_per_slot > 0)
      r->pools_.state = ops->alloc(slots, spec.state_floats_per_slot, DType::F32, "state slots");
    if (spec.kv_layers > 0)
      r->pools_.kv = ops->alloc(static_cast<int64_t>(spec.kv_layers) * pages * cache.page_size_tokens,
                                spec.kv_row_width, cache.layout.kv_dtype.value_or(ops->act_dtype()), "KV pages");
    if (spec.index_layers > 0)
      r->pools_.index_kv = ops->alloc(static_cast<int64_t>(spec.index_layers) * pages * cache.page_size_tokens,
                                      spec.index_row_width, spec.index_dtype, "DSA indexer-key pages");
    // Speculative decoding: every verified row of a step, saved for the next one's rollbacks.
    const int64_t replay_floats = model->replay_floats_per_token();
    if (options.num_speculative_tokens > 0 && replay_floats > 0 && spec.state_floats_per_slot > 0) {
      r->replay_capacity_rows_ = options.max_seqs_per_step * (1 + options.num_speculative_tokens);
      r->pools_.replay = ops->alloc(r->replay_capacity_rows_, replay_floats, DType::F32, "speculative replay rows");
    }
    ops->synchronize();
  } catch (const BackendError& e) {
    return resource_exhausted(std::string("allocating the cache pools failed: ") + e.what());
  }
  r->pools_.num_slots = slots;
  r->pools_.num_pages = pages;
  r->pools_.page_size_tokens = cache.page_size_tokens;
  r->ops_ = std::move(ops);
  r->model_ = std::move(model);
  return r;
}

Status ModelRunner::attach_draft(std::unique_ptr<DSparkDraft> draft) {
  if (!draft) return invalid_argument("attach_draft: no draft");
  if (options_.rank != 0 || !model_->draft_shared().ok())
    return unimplemented("a DSpark draft runs on a single GPU (tensor parallelism: not yet)");
  if (lane_) return invalid_argument("attach the DSpark draft before the prefill lane (its runner ingests too)");
  const DSparkConfig& dc = draft->config();
  // Every token row a step can carry, padded decode batches included.
  pools_.taps_stride_rows = std::max<int64_t>(options_.max_tokens_per_step,
                                        static_cast<int64_t>(options_.max_seqs_per_step) *
                                            (1 + std::max(options_.num_speculative_tokens, dc.block_size)));
  try {
    pools_.taps = ops_->alloc(dc.n_taps() * pools_.taps_stride_rows, dc.hidden_size, DType::F32, "dspark taps");
    // Blocks reach B - 1 positions past the longest context.
    const int64_t cache_tokens = static_cast<int64_t>(cache_.num_pages) * cache_.page_size_tokens;
    const int64_t longest =
        options_.max_positions > 0 ? std::min(options_.max_positions, cache_tokens) : cache_tokens;
    draft_pool_ = draft->allocate_pool(*ops_, pools_.num_pages, cache_.page_size_tokens,
                                       pools_.kv.empty() ? ops_->act_dtype() : pools_.kv.dtype,
                                       options_.max_seqs_per_step, longest + dc.block_size);
    ops_->synchronize();
  } catch (const BackendError& e) {
    return resource_exhausted(std::string("allocating the draft's cache failed: ") + e.what());
  }
  if (!model_->set_taps(dc.target_layer_ids))
    return unimplemented("this model cannot give a DSpark draft its layers' outputs");
  draft_ = std::move(draft);
  ingest_draft_ = draft_.get();
  return Status::ok();
}

Status ModelRunner::propose_blocks(std::span<const DraftBlockRequest> requests,
                                   std::vector<DraftBlockResult>& results, bool want_logits) {
  if (!draft_) return StepRunner::propose_blocks(requests, results, want_logits);
  if (!failed_.is_ok()) return failed_;
  try {
    for (size_t at = 0; at < requests.size(); at += options_.max_seqs_per_step) {
      const size_t n = std::min<size_t>(options_.max_seqs_per_step, requests.size() - at);
      std::vector<DraftBlockResult> part;
      ops_->reset_scratch();
      draft_->propose(*ops_, requests.subspan(at, n), draft_pool_, model_->draft_shared(), part, want_logits,
                      /*capture=*/options_.cuda_graphs && ops_->captures() && !profile_);
      if (at == 0) results = std::move(part);
      else results.insert(results.end(), std::make_move_iterator(part.begin()), std::make_move_iterator(part.end()));
    }
    ops_->synchronize();
  } catch (const BackendError& e) {
    failed_ = internal_error(std::string(ops_->name()) + " backend failure in the draft: " + e.what());
    return failed_;
  }
  return Status::ok();
}

Status ModelRunner::enable_prefill_lane(int chunk_tokens) {
  if (lane_) return Status::ok();
  if (ops_->parallel_size() > 1)
    return invalid_argument("a rank of a group gets its lane from its group (ParallelRunner::enable_prefill_lane)");
  lane_ = std::make_unique<PrefillLane>(MR_TRY(make_lane_runner(chunk_tokens, nullptr)));
  return Status::ok();
}

Result<std::unique_ptr<ModelRunner>> ModelRunner::make_lane_runner(int chunk_tokens, std::unique_ptr<Communicator> comm) {
  if (chunk_tokens < 1) return invalid_argument("a prefill lane's chunks need at least one token");
  if (options_.dp_attention_size > 1 || model_->pipeline_stages() > 1)
    return unimplemented("a prefill lane runs beside one GPU or a tensor-parallel group (not --pp-size > 1 or DP "
                         "attention)");
  std::unique_ptr<Ops> lane_ops;
  // With a DSpark draft the lane's forward taps the draft's layers into a buffer of its own
  // (CachePools::taps; the main steps write the model's) and ingests the chunk's context rows
  // into the draft's pages of its sequence, as a main step would: the draft and its pool are
  // this runner's (ingest reads the draft's weights, writes only the batch's pages).
  Tensor lane_taps;
  if (ingest_draft_) {
    try {
      lane_taps = ops_->alloc(ingest_draft_->config().n_taps() * static_cast<int64_t>(chunk_tokens),
                              ingest_draft_->config().hidden_size, DType::F32, "prefill lane dspark taps");
    } catch (const BackendError& e) {
      return resource_exhausted(std::string("allocating the prefill lane's DSpark taps failed: ") + e.what());
    }
  }
  try {
    lane_ops = ops_->make_lane(static_cast<size_t>(model_->scratch_bytes(chunk_tokens)), std::move(comm));
  } catch (const BackendError& e) {
    return resource_exhausted(std::string("allocating the prefill lane's scratch failed: ") + e.what());
  }
  if (!lane_ops) return unimplemented(std::string("the ") + ops_->name() + " backend has no second lane here");
  std::unique_ptr<ModelRunner> r(new ModelRunner());
  r->cache_ = cache_;
  r->options_ = options_;
  r->options_.cuda_graphs = false;         // a chunk's shape is new each time
  r->options_.max_tokens_per_step = chunk_tokens;
  r->options_.num_speculative_tokens = 0;  // it verifies nothing
  r->options_.fail_after_steps = -1;
  r->pools_ = pools_;
  r->pad_slot_ = pad_slot_;
  r->pad_page_ = pad_page_;
  r->ops_ = std::move(lane_ops);
  r->model_ = model_;
  if (ingest_draft_) {
    r->ingest_draft_ = ingest_draft_;
    r->draft_pool_ = draft_pool_;
    r->pools_.taps = lane_taps;
    r->pools_.taps_stride_rows = chunk_tokens;
  }
  return r;
}

ModelRunner::~ModelRunner() {
  lane_.reset();  // its ops read this one's memory
  if (ops_) {
    try {
      ops_->synchronize();
    } catch (const BackendError&) {
    }
  }
  draft_.reset();
  model_.reset();  // before the backend that holds its weights
  ops_.reset();
}

Status ModelRunner::check(const StepInput& input) const {
  const ModelConfig& cfg = model_->config();
  const CacheSpec spec = model_->cache_spec();
  size_t n_sampling = 0;
  for (size_t s = 0; s < input.seqs.size(); ++s) {
    const StepSeq& seq = input.seqs[s];
    const std::string where = "sequence " + std::to_string(s) + ": ";
    if (seq.new_token_ids.empty()) return invalid_argument(where + "no new tokens");
    for (int32_t id : seq.new_token_ids)
      if (id < 0 || id >= cfg.vocab_size)
        return invalid_argument(where + "token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                                std::to_string(cfg.vocab_size) + ")");
    if (spec.state_floats_per_slot > 0 && (seq.state_slot < 0 || seq.state_slot >= cache_.total_slots()))
      return invalid_argument(where + "state slot " + std::to_string(seq.state_slot) + " is not in [0, " +
                              std::to_string(cache_.total_slots()) + ")");
    if (spec.kv_layers > 0) {
      const int64_t n_total = seq.n_past + static_cast<int64_t>(seq.new_token_ids.size());
      const int64_t pages_needed = (n_total + cache_.page_size_tokens - 1) / cache_.page_size_tokens;
      if (static_cast<int64_t>(seq.pages.size()) < pages_needed)
        return invalid_argument(where + std::to_string(seq.pages.size()) + " KV pages cover fewer than " +
                                std::to_string(n_total) + " tokens");
      for (int64_t p = 0; p < pages_needed; ++p)
        if (seq.pages[p] < 0 || seq.pages[p] >= cache_.num_pages)
          return invalid_argument(where + "KV page " + std::to_string(seq.pages[p]) + " is not in the pool");
      if (cache_.page_groups > 1) {  // DP attention: the pages of the rank that runs it (its slot's group)
        const int per = cache_.num_pages / cache_.page_groups, group = std::max(seq.state_slot, 0) % cache_.page_groups;
        for (int64_t p = 0; p < pages_needed; ++p)
          if (seq.pages[p] / per != group)
            return invalid_argument(where + "KV page " + std::to_string(seq.pages[p]) + " is not in page group " +
                                    std::to_string(group) + " (pages " + std::to_string(group * per) + " .. " +
                                    std::to_string((group + 1) * per - 1) + ") of its state slot " +
                                    std::to_string(seq.state_slot));
      }
    }
    if (seq.sample) n_sampling += 1 + static_cast<size_t>(std::max(seq.n_draft, 0));
    if (!seq.given_at.empty()) {
      if (seq.given_rows.size() != seq.given_at.size() * static_cast<size_t>(cfg.hidden_size))
        return invalid_argument(where + std::to_string(seq.given_at.size()) + " given rows but " +
                                std::to_string(seq.given_rows.size()) + " values (hidden " +
                                std::to_string(cfg.hidden_size) + ")");
      for (int32_t at : seq.given_at)
        if (at < 0 || at >= static_cast<int32_t>(seq.new_token_ids.size()))
          return invalid_argument(where + "given row " + std::to_string(at) + " is not one of its new tokens");
    }
  }
  if (n_sampling != input.sampling.rows.size())
    return invalid_argument("the sequences sample " + std::to_string(n_sampling) + " rows but the step has " +
                            std::to_string(input.sampling.rows.size()) + " sampling rows");
  for (const StateCopy& c : input.before)
    if (c.dst < 0 || c.dst >= cache_.all_slots() || c.src >= cache_.all_slots())
      return invalid_argument("state copy into slot " + std::to_string(c.dst) + " is outside the pool");
  for (const StateCopy& c : input.after)
    if (c.dst < 0 || c.dst >= cache_.all_slots() || c.src < 0 || c.src >= cache_.all_slots())
      return invalid_argument("state snapshot into slot " + std::to_string(c.dst) + " is outside the pool");
  int saved = 0;
  for (const StepSeq& seq : input.seqs) {
    if (seq.n_draft < 0 || seq.n_draft >= static_cast<int>(seq.new_token_ids.size()))
      return invalid_argument(std::to_string(seq.n_draft) + " drafts among " + std::to_string(seq.new_token_ids.size()) +
                              " new tokens");
    if (seq.n_draft > 0) saved += static_cast<int>(seq.new_token_ids.size());
  }
  if (saved > 0 && !pools_.replay.empty() && saved > replay_capacity_rows_)
    return invalid_argument("the step verifies " + std::to_string(saved) + " rows; the replay buffer holds " +
                            std::to_string(replay_capacity_rows_));
  for (const StateReplay& r : input.replays) {
    if (pools_.state.empty()) continue;
    if (pools_.replay.empty()) return invalid_argument("state rollback without a replay buffer (speculation off)");
    if (r.slot < 0 || r.slot >= cache_.all_slots() || r.snapshot < 0 || r.snapshot >= cache_.all_slots() ||
        r.n_tokens < 1 || r.first_row < 0 || r.first_row + r.n_tokens > last_saved_rows_)
      return invalid_argument("state rollback of slot " + std::to_string(r.slot) + " over saved rows [" +
                              std::to_string(r.first_row) + ", " + std::to_string(r.first_row + r.n_tokens) +
                              ") of " + std::to_string(last_saved_rows_));
  }
  return Status::ok();
}

void ModelRunner::build_batch(const StepInput& input, int padded_seqs, int pad_tokens) {
  batch_.token_ids.clear();
  batch_.positions.clear();
  batch_.token_seq.clear();
  batch_.seqs.clear();
  batch_.page_table.clear();
  batch_.logit_rows.clear();
  batch_.embed_rows.clear();
  batch_.embed_values.clear();
  batch_.save_rows.clear();
  batch_.dp_tokens.clear();
  for (const StepSeq& s : input.seqs) {
    // A verifying sequence: logits for every new token, and its rows saved (when the model
    // keeps a recurrent state) for a rollback to any prefix of them.
    if (s.n_draft > 0 && !pools_.replay.empty())
      for (int t = 0; t < static_cast<int>(s.new_token_ids.size()); ++t) batch_.save_rows.push_back(batch_.n_tokens() + t);
    for (int32_t at : s.given_at) batch_.embed_rows.push_back(batch_.n_tokens() + at);
    batch_.embed_values.insert(batch_.embed_values.end(), s.given_rows.begin(), s.given_rows.end());
    const int n_new = static_cast<int>(s.new_token_ids.size());
    const int n_pages = static_cast<int>(
        std::min<int64_t>(s.pages.size(), (s.n_past + n_new + cache_.page_size_tokens - 1) / cache_.page_size_tokens));
    batch_.add_seq(s.new_token_ids.data(), n_new, s.n_past, s.state_slot, s.pages.data(), n_pages,
                   s.all_logits || s.n_draft > 0);
  }
  // Padding sequences (a captured graph's spare rows) bring as many tokens as the others, and
  // are verified and saved alike when they are: the step's shape is the graph's.
  static const std::vector<int32_t> kPadTokens(kShortSeqMaxNewTokens, 0);
  for (int s = static_cast<int>(input.seqs.size()); s < padded_seqs; ++s) {
    if (pad_tokens > 1 && !pools_.replay.empty())
      for (int t = 0; t < pad_tokens; ++t) batch_.save_rows.push_back(batch_.n_tokens() + t);
    batch_.add_seq(kPadTokens.data(), pad_tokens, 0, pad_slot_, &pad_page_, 1, pad_tokens > 1);
  }
}

void ModelRunner::run_replays(Ops& ops, const std::vector<StateReplay>& replays) {
  if (replays.empty() || pools_.state.empty()) return;
  replay_batch_ = ForwardBatch{};
  bool short_runs = static_cast<int>(replays.size()) <= kMaxCapturedReplays;
  for (const StateReplay& r : replays) {
    // The slot restarts from its verify slot (slot addresses are the host's choice: a copy
    // outside any graph).
    ops.copy(pools_.state.rows_view(r.snapshot, 1), pools_.state.rows_view(r.slot, 1));
    // A replay reads no token: its id table carries the saved rows it advances over.
    replay_rows_.resize(static_cast<size_t>(r.n_tokens));
    for (int t = 0; t < r.n_tokens; ++t) replay_rows_[t] = r.first_row + t;
    replay_batch_.add_seq(replay_rows_.data(), r.n_tokens, 0, r.slot, &pad_page_, 1);
    short_runs = short_runs && r.n_tokens <= kShortSeqMaxNewTokens;
  }
  // Its own staging area: the step's batch, uploaded next, must not overwrite these tables
  // before their copy ran (no synchronisation between the two).
  const BatchView view = ops.upload_batch(replay_batch_, /*area=*/1);
  const auto body = [&] { model_->replay_state(ops, view, pools_); };
  // A few short replays (one stream, or a handful) are a few dozen tiny launches: one graph
  // per (sequences, tokens) shape, as a step's. Many at once: eager (the shapes multiply,
  // and the launches are then a small part of a large batch's step).
  if (options_.cuda_graphs && ops.captures() && short_runs) {
    const uint64_t key = kReplayGraphKey | static_cast<uint64_t>(replay_batch_.n_seqs()) << 32 |
                         static_cast<uint64_t>(replay_batch_.n_tokens());
    ops.run_captured(key, body);
  } else {
    body();
  }
}

void ModelRunner::run_state_copies(const std::vector<StateCopy>& copies) {
  if (pools_.state.empty()) return;
  for (const StateCopy& c : copies) {
    const Tensor dst = pools_.state.rows_view(c.dst, 1);
    if (c.src < 0) ops_->zero(dst);
    else ops_->copy(pools_.state.rows_view(c.src, 1), dst);
  }
}

void ModelRunner::sample_rows(Ops& ops, const StepInput& input, const Tensor& logits,
                              const std::vector<int32_t>* order, StepOutput& output) {
  // Each sampling sequence samples from its last logits row; a verifying one from the rows
  // of its last known token and of each draft.
  std::vector<int32_t> rows;
  int row = 0;
  for (const StepSeq& s : input.seqs) {
    row += logit_rows_of(s);
    if (s.sample)
      for (int j = s.n_draft; j >= 0; --j) rows.push_back(order ? (*order)[row - 1 - j] : row - 1 - j);
  }
  if (rows.empty()) return;
  Tensor to_sample = logits.rows_view(0, static_cast<int64_t>(rows.size()));
  bool identity = true;
  for (size_t i = 0; i < rows.size(); ++i) identity = identity && rows[i] == static_cast<int32_t>(i);
  if (!identity) {
    Tensor index = ops.scratch(static_cast<int64_t>(rows.size()), 1, DType::I32);
    ops.upload(index, 0, rows.data(), rows.size() * sizeof(int32_t));
    to_sample = ops.scratch(static_cast<int64_t>(rows.size()), logits.cols, DType::F32);
    ops.gather_rows(logits, index.as<int32_t>(), to_sample);
  }
  ops.sample(to_sample, input.sampling, output.samples);
}

Status ModelRunner::step_dp(const StepInput& input, StepOutput& output) {
  const int D = options_.dp_attention_size, me = options_.rank % D;
  const auto owner = [&](const StepSeq& s) { return std::max(s.state_slot, 0) % D; };
  // Every rank's tokens and logits rows (rank order), and where this rank's rows start.
  std::vector<int32_t> tokens(static_cast<size_t>(D), 0), rows_of(static_cast<size_t>(D), 0);
  StepInput mine;
  // This rank's pool holds its page group only (CacheConfig::page_groups): its sequences'
  // page ids, shifted to the group's start.
  const int group_pages = cache_.num_pages / std::max(cache_.page_groups, 1);
  const int32_t first_page = cache_.page_groups > 1 ? me * group_pages : 0;
  std::vector<std::vector<int32_t>> local_pages;
  local_pages.reserve(input.seqs.size());
  for (const StepSeq& s : input.seqs) {
    tokens[owner(s)] += static_cast<int32_t>(s.new_token_ids.size());
    rows_of[owner(s)] += logit_rows_of(s);
    if (owner(s) != me) continue;
    mine.seqs.push_back(s);
    if (cache_.page_groups <= 1) continue;
    mine.seqs.back().state_slot = s.state_slot / D;  // this rank's slots only (ModelRunner::create)
    std::vector<int32_t>& local = local_pages.emplace_back(s.pages.begin(), s.pages.end());
    for (int32_t& p : local) {
      MR_CHECK(p >= first_page && p < first_page + group_pages) << "page " << p << " past the validated group";
      p -= first_page;
    }
    mine.seqs.back().pages = local;
  }
  std::vector<int32_t> first_row(static_cast<size_t>(D), 0);
  for (int r = 1; r < D; ++r) first_row[r] = first_row[r - 1] + rows_of[r - 1];
  const int all_rows = first_row[D - 1] + rows_of[D - 1];
  // The slot commands of this rank's slots, at their local ids (a fresh slot zeroed: with no
  // prefix cache and no speculation under DP a copy never crosses ranks).
  const auto local_copies = [&](const std::vector<StateCopy>& copies) {
    std::vector<StateCopy> out;
    for (const StateCopy& c : copies) {
      if (cache_.page_groups <= 1) {
        out.push_back(c);
        continue;
      }
      if (c.dst % D != me) continue;
      MR_CHECK(c.src < 0 || c.src % D == me) << "state copy " << c.src << " -> " << c.dst << " across DP ranks";
      out.push_back({c.src < 0 ? c.src : c.src / D, c.dst / D});
    }
    return out;
  };
  Ops& ops = *ops_;
  try {
    ops.reset_scratch();
    run_state_copies(local_copies(input.before));
    build_batch(mine, static_cast<int>(mine.seqs.size()), 1);
    batch_.dp_tokens = tokens;
    batch_.dp_rank = me;
    for (const StepSeq& s : mine.seqs) tokens_computed_ += static_cast<int64_t>(s.new_token_ids.size());
    const BatchView view = ops.upload_batch(batch_);
    const int V = vocab();
    // The gather of the logits rows as a sum: each rank's rows in its place, zeros elsewhere.
    const Tensor all_logits = ops.scratch(all_rows, V, DType::F32);
    ops.zero(all_logits);
    const int64_t model_positions = model_->max_positions();
    for (const BatchSeq& s : batch_.seqs)
      if (model_positions > 0 && s.n_past + s.n_new > model_positions)
        return invalid_argument("a sequence reaches position " + std::to_string(s.n_past + s.n_new) +
                                ", past the model's " + std::to_string(model_positions) +
                                " positions (its rope table; --context-length sizes it)");
    model_->forward(ops, view, pools_, all_logits.rows_view(first_row[me], rows_of[me]));
    ops.all_reduce_sum(all_logits);
    run_state_copies(local_copies(input.after));
    if (options_.rank != 0) {
      ops.synchronize();
      return Status::ok();
    }
    // Back to the step's order: sequence i's rows sit at its owner's next rows.
    std::vector<int32_t> at(static_cast<size_t>(D), 0), order;  // order: a gathered row per step row
    for (const StepSeq& s : input.seqs) {
      const int r = owner(s), n = logit_rows_of(s);
      for (int j = 0; j < n; ++j) order.push_back(first_row[r] + at[r] + j);
      at[r] += n;
    }
    if (input.return_logits) {
      output.logits.resize(static_cast<size_t>(all_rows) * V);
      for (size_t i = 0; i < order.size(); ++i)
        ops.download(all_logits.rows_view(order[i], 1), output.logits.data() + i * V);
    }
    sample_rows(ops, input, all_logits, &order, output);
    ops.synchronize();
  } catch (const BackendError& e) {
    ops.abort_collectives(e.what());
    failed_ = internal_error(std::string(ops.name()) + " backend failure: " + e.what());
    return failed_;
  }
  return Status::ok();
}

Result<std::vector<float>> ModelRunner::encode_images(std::span<const vision::ImagePatches* const> images) {
  if (!failed_.is_ok()) return failed_;
  if (!model_->has_vision()) return unimplemented("images: the model has no vision tower (no vision_tower.* weights)");
  if (options_.rank != 0 || ops_->parallel_size() > 1)
    return unimplemented("images: the vision tower runs on a single-rank runner only (--tp-size 1)");
  // A fixed arena holds the tower's scratch for a bounded number of patches (Model::
  // scratch_bytes): more is a request error, not a full device that fails the backend.
  // The same bound on every backend, so a request is refused or served alike everywhere.
  int64_t patches = 0;
  for (const vision::ImagePatches* im : images) patches += static_cast<int64_t>(im->grid_h) * im->grid_w;
  const int64_t budget = Model::max_image_patches(options_.max_tokens_per_step);
  if (patches > budget)
    return invalid_argument("images: " + std::to_string(patches) + " patches of 14 px in one request, over this " +
                            "server's " + std::to_string(budget) + " (4 per token of --chunked-prefill-size)");
  try {
    // The step's scratch is free between steps; the tower uses it and leaves it reset.
    ops_->reset_scratch();
    std::vector<float> rows = model_->encode_images(*ops_, images);
    ops_->synchronize();
    return rows;
  } catch (const BackendError& e) {
    ops_->abort_collectives(e.what());
    failed_ = internal_error(std::string(ops_->name()) + " backend failure in the vision tower: " + e.what());
    return failed_;
  }
}

Status ModelRunner::check_positions() const {
  const int64_t model_positions = model_->max_positions();
  for (const BatchSeq& s : batch_.seqs) {
    if (ingest_draft_ && s.n_past + s.n_new > draft_pool_.rope.rows)
      return invalid_argument("a sequence reaches position " + std::to_string(s.n_past + s.n_new) +
                              ", past the DSpark draft's " + std::to_string(draft_pool_.rope.rows) + " rope rows");
    if (model_positions > 0 && s.n_past + s.n_new > model_positions)
      return invalid_argument("a sequence reaches position " + std::to_string(s.n_past + s.n_new) +
                              ", past the model's " + std::to_string(model_positions) +
                              " positions (its rope table; --context-length sizes it)");
  }
  return Status::ok();
}

std::vector<int> ModelRunner::micro_batch_starts(const StepInput& input, bool graph) const {
  const int stages = model_->pipeline_stages();
  const int want = options_.pipeline_micro_batches > 0 ? options_.pipeline_micro_batches : stages;
  const int n = static_cast<int>(input.seqs.size());
  if (stages <= 1 || want <= 1 || graph || n < 2 || ingest_draft_) return {};
  int64_t total = 0;
  for (const StepSeq& s : input.seqs) {
    // Saved rows for a rollback and image rows are numbered over the whole step.
    if (s.n_draft > 0 || !s.given_at.empty()) return {};
    total += static_cast<int64_t>(s.new_token_ids.size());
  }
  // Contiguous groups of about equal tokens (a prefill chunk beside decodes gets a group of
  // its own), every group at least one sequence.
  const int M = std::min(want, n);
  std::vector<int> starts{0};
  int64_t tokens = 0;
  for (int i = 1; i < n && static_cast<int>(starts.size()) < M; ++i) {
    tokens += static_cast<int64_t>(input.seqs[i - 1].new_token_ids.size());
    const int groups_left = M - static_cast<int>(starts.size());
    if (n - i == groups_left || tokens * M >= total * static_cast<int64_t>(starts.size())) starts.push_back(i);
  }
  return starts;
}

Status ModelRunner::forward_micro_batches(Ops& ops, const StepInput& input, const std::vector<int>& starts,
                                          Tensor logits) {
  // The rows that get logits, every micro-batch's in step order: filled on the last stage,
  // sent round the ring once (Model::forward_head).
  const Tensor rows = ops.scratch(logits.rows, model_->config().hidden_size, DType::F32);
  const size_t mark = ops.scratch_mark();
  int64_t at = 0;
  StepInput part;
  for (size_t g = 0; g < starts.size(); ++g) {
    const int begin = starts[g];
    const int end = g + 1 < starts.size() ? starts[g + 1] : static_cast<int>(input.seqs.size());
    part.seqs.assign(input.seqs.begin() + begin, input.seqs.begin() + end);
    // The batch tables' staging is rewritten by the next upload: the previous one must have
    // been copied (on a GPU this waits for this stage's part of the micro-batch before, and
    // the later stages go on with it meanwhile).
    if (g > 0) ops.synchronize();
    ops.scratch_rewind(mark);
    build_batch(part, end - begin, 1);
    MR_RETURN_IF_ERROR(check_positions());
    const BatchView view = ops.upload_batch(batch_);
    const int64_t r = view.n_logit_rows();
    model_->forward_body(ops, view, pools_, rows.rows_view(at, r));
    at += r;
    ++micro_batches_;
  }
  ops.scratch_rewind(mark);
  model_->forward_head(ops, rows, logits);
  return Status::ok();
}

Status ModelRunner::step(const StepInput& input, StepOutput& output) {
  if (!failed_.is_ok()) return failed_;
  if (options_.fail_after_steps >= 0 && steps_ >= options_.fail_after_steps)
    return internal_error("injected backend failure after " + std::to_string(options_.fail_after_steps) +
                          " steps (--debug-fail-after-steps)");
  ++steps_;
  output.samples.clear();
  output.logits.clear();
  if (input.seqs.empty()) return Status::ok();
  MR_RETURN_IF_ERROR(check(input));
  if (options_.dp_attention_size > 1) return step_dp(input, output);
  // A profiled step runs every op through ProfiledOps, eagerly (bench-model --profile).
  std::optional<ProfiledOps> profiled;
  if (profile_) profiled.emplace(*ops_, *profile_);
  Ops& ops = profiled ? static_cast<Ops&>(*profiled) : *ops_;
  const int n_seqs = static_cast<int>(input.seqs.size());
  // A graph replays steps whose sequences all bring the same short run of tokens: decode
  // steps (one each) and speculative verify steps (the last token and n - 1 drafts each,
  // every row saved). A step with given rows uploads them inside the forward: never a graph.
  const int tokens_each = static_cast<int>(input.seqs.front().new_token_ids.size());
  bool uniform = tokens_each <= kShortSeqMaxNewTokens && tokens_each <= cache_.page_size_tokens;
  for (const StepSeq& s : input.seqs)
    uniform = uniform && static_cast<int>(s.new_token_ids.size()) == tokens_each && s.given_at.empty() &&
              (tokens_each == 1 || s.n_draft == tokens_each - 1);
  const bool graph = options_.cuda_graphs && ops.captures() && uniform && n_seqs <= options_.max_seqs_per_step;
  const int padded = graph ? decode_bucket(n_seqs, options_.max_seqs_per_step) : n_seqs;
  const std::vector<int> micro = micro_batch_starts(input, graph);
  static DebugPhases phases("runner step", {"previous work", "replays", "copies+batch", "forward", "sample"});
  const auto sync = [&] { ops.synchronize(); };
  try {
    phases.start();
    phases.mark(0, sync);
    ops.reset_scratch();
    run_replays(ops, input.replays);
    phases.mark(1, sync);
    ops.reset_scratch();
    run_state_copies(input.before);
    if (padded > n_seqs && !pools_.state.empty()) ops.zero(pools_.state.rows_view(pad_slot_, 1));
    for (const StepSeq& s : input.seqs) tokens_computed_ += static_cast<int64_t>(s.new_token_ids.size());
    const int V = vocab();
    Tensor logits;  // [rows, vocab]
    if (micro.size() > 1) {
      int n_rows = 0;
      for (const StepSeq& s : input.seqs) n_rows += logit_rows_of(s);
      logits = ops.scratch(n_rows, V, DType::F32);
      last_saved_rows_ = 0;
      MR_RETURN_IF_ERROR(forward_micro_batches(ops, input, micro, logits));
    } else {
    build_batch(input, padded, tokens_each);
    last_saved_rows_ = static_cast<int>(batch_.save_rows.size());
    const BatchView view = ops.upload_batch(batch_);
    phases.mark(2, sync);
    logits = ops.scratch(view.n_logit_rows(), V, DType::F32);
    // The draft's context rows of every token this step computed (drafts included: a
    // rejected one's row lies past the next anchor, unseen, until overwritten), in the same
    // graph as the forward.
    // Tables per position (rope rows) bound the positions a step may reach; a graph replay
    // would not check.
    MR_RETURN_IF_ERROR(check_positions());
    const auto body = [&] {
      model_->forward(ops, view, pools_, logits);
      if (ingest_draft_) ingest_draft_->ingest(ops, view, pools_.taps, pools_.taps_stride_rows, draft_pool_);
    };
    if (graph) {
      // tokens_each is at most kShortSeqMaxNewTokens: bits 32..39; the model's own shape
      // dependence (Model::graph_variant: K3.1's score width) above them.
      const uint64_t key = static_cast<uint64_t>(padded) | static_cast<uint64_t>(tokens_each) << 32 |
                           static_cast<uint64_t>(model_->graph_variant(batch_)) << 40;
      ops.run_captured(key, body);
      ++graph_replays_;
    } else {
      body();
    }
    }
    run_state_copies(input.after);
    phases.mark(3, sync);

    // Rank 0 alone answers; the other ranks of a tensor-parallel group only had to take
    // part in the forward's collectives.
    if (options_.rank != 0) {
      ops.synchronize();
      return Status::ok();
    }
    // The logits as the model made them (a backend's sampler may edit its rows in place).
    if (input.return_logits) {
      int n_rows = 0;
      for (const StepSeq& s : input.seqs) n_rows += logit_rows_of(s);
      output.logits.resize(static_cast<size_t>(n_rows) * V);
      ops.download(logits.rows_view(0, n_rows), output.logits.data());
    }
    sample_rows(ops, input, logits, nullptr, output);
    ops.synchronize();
    phases.mark(4, sync);
    phases.done();
  } catch (const BackendError& e) {
    // The backend's state is unknown after a failure: every later step fails too. The
    // other ranks of the group may be waiting for this one in a collective: wake them.
    ops.abort_collectives(e.what());
    failed_ = internal_error(std::string(ops.name()) + " backend failure: " + e.what());
    return failed_;
  }
  return Status::ok();
}

}  // namespace moonrun
