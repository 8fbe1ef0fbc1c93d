#pragma once
// What the runtime knows of a model: its config, what one sequence costs in the caches, and
// a batched forward that turns one step's tokens into logits. Written once per
// architecture against the ops (model/kimi_k3.cpp), so the same model runs on every backend.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>
#include <string>

#include "backend/ops.h"
#include "common/status.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/pipeline.h"
#include "model/vision/preprocess.h"

namespace moonrun {

// Per-sequence cache needs, in backend-neutral terms. The row kinds of the paged pool share
// one page table: a page id addresses the same tokens' rows in every kind, so the page
// allocator, the prefix cache (shared pages) and preemption (freed pages) cover every kind
// at once, and the bytes per token (what sizes the pool and what `plan` counts) sum them.
struct CacheSpec {
  int64_t state_floats_per_slot = 0;  // fixed-size recurrent state of one sequence (F32), all layers
  int kv_layers = 0;                  // layers that keep a paged KV row per token (MLA's latent)
  int kv_row_width = 0;               // values per token per such layer
  // DSA indexer keys (K3.1): per token and DSA layer one row of index_row_width values in
  // index_dtype, whatever the latent's dtype (the CPU keeps them F32).
  int index_layers = 0;
  int index_row_width = 0;
  DType index_dtype = DType::F32;
  int64_t state_bytes_per_slot() const { return state_floats_per_slot * 4; }
  int64_t kv_bytes_per_token(DType kv_dtype) const {
    return static_cast<int64_t>(kv_layers) * kv_row_width * static_cast<int64_t>(dtype_size_bytes(kv_dtype)) +
           index_bytes_per_token();
  }
  int64_t index_bytes_per_token() const {
    return static_cast<int64_t>(index_layers) * index_row_width * static_cast<int64_t>(dtype_size_bytes(index_dtype));
  }
};

// The cache memory a forward reads and writes (the runner owns it).
struct CachePools {
  Tensor state;  // [num_slots, state_floats_per_slot] F32
  Tensor kv;     // [kv_layers * num_pages * page_size_tokens, kv_row_width]
  Tensor index_kv;  // [index_layers * num_pages * page_size_tokens, index_row_width]; same pages as kv
  // Speculative decoding: what a verifying step saved of its draft rows for a state rollback,
  // [capacity rows, Model::replay_floats_per_token()] F32; empty when nothing is saved.
  Tensor replay;
  // DSpark: where a forward copies the tapped layers' rows (Model::set_taps names the layers):
  // [n_taps * taps_stride_rows, hidden] F32, each runner its own (the prefill lane's too).
  Tensor taps;
  int64_t taps_stride_rows = 0;
  int num_slots = 0;
  int num_pages = 0;
  int page_size_tokens = 0;
};

// Which rank of a tensor/expert-parallel group loads the model (rank 0 of 1: everything).
// Attention heads, dense and shared MLPs and the vocabulary split over all world_size
// ranks; the routed experts over ep_size groups (each group's ranks split every expert's
// intermediate dimension), as in SGLang (--tp-size, --ep-size).
struct LoadOptions {
  int rank = 0;
  int world_size = 1;
  int ep_size = 1;
  // Pipeline parallelism: the layers this rank's stage runs (rank and world_size are then
  // its place in the stage's own tensor-parallel group). All of them by default.
  StageLayers stage;
  // Split the MoE router / the LatentMoE projections over the group (WeightLayout).
  bool split_router = false;
  bool split_latent_moe = false;  // the down projection (and with split_latent_up the up one)
  bool split_latent_up = false;
  // DP attention: all but the routed experts whole on every rank (ParallelRank::dp_attention).
  bool dp_attention = false;
  bool log_progress = false;  // progress lines (bytes, GB/s, ETA) for long loads
  // The longest context served (0: the config's max_position_embeddings): what a model that
  // keeps a table per position (RoPE rows) sizes it for.
  int64_t max_positions = 0;
  // DSA (K3.1): the indexer-key cache's rows, F32 or F8_E4M3 with a scale
  // (backend/dsa_index_row.h; RuntimeOptions::index_cache_dtype).
  DType index_cache_dtype = DType::F32;
};

// What a draft model shares with its target (DSpark: model/dspark_draft.h): the embedding
// table and lm_head, whole on this rank.
struct DraftSharedWeights {
  const Matrix* embed_tokens = nullptr;  // [vocab, hidden]
  const Matrix* lm_head = nullptr;       // [vocab, hidden]
  bool ok() const { return embed_tokens && lm_head; }
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelConfig& config() const = 0;
  virtual CacheSpec cache_spec() const = 0;
  // What a pipeline stage running layers [first_layer, end_layer) would keep, with this
  // rank's tensor-parallel share: every stage's pools get the same slots and pages, sized
  // by the stage that needs the most, which a process holding other stages must know.
  virtual CacheSpec cache_spec_of_layers(int first_layer, int end_layer) const { return cache_spec(); }
  // Appends each sequence's new tokens to its caches and writes the logits of
  // batch.host->logit_rows: logits [n_logit_rows, vocab] F32. Enqueued on the ops' stream.
  virtual void forward(Ops& ops, const BatchView& batch, const CachePools& pools, Tensor logits) = 0;
  // Pipeline parallelism (model/pipeline.h): the stages of the model; above 1, the runner
  // may split a step's sequences into micro-batches (ModelRunner::step) and run forward() in
  // its two parts: forward_body once a micro-batch - this stage's layers, from the previous
  // stage's hop to the next's; the last stage gathers the pre-norm rows that get logits into
  // `rows` [n_logit_rows, hidden] F32 instead of sending them - then forward_head once for
  // all of them: the rows of every micro-batch round the ring in one hop (last stage to the
  // first) and the head's norm and lm_head on the first stage into logits [rows, vocab].
  // forward() is forward_body + forward_head for one batch. Why the ring waits for every
  // micro-batch: a hop is a rendezvous, so the first stage must have sent its last
  // micro-batch before it can take rows back (the last stage would otherwise wait to send
  // while the first waits to send it the next micro-batch).
  virtual int pipeline_stages() const { return 1; }
  virtual void forward_body(Ops& ops, const BatchView& batch, const CachePools& pools, Tensor rows) {
    throw BackendError("this model has no pipeline stages");
  }
  virtual void forward_head(Ops& ops, Tensor rows, Tensor logits) {
    throw BackendError("this model has no pipeline stages");
  }

 protected:
  // forward() of a model with stages: its two parts over one batch (in the caller's scratch scope).
  void forward_in_parts(Ops& ops, const BatchView& batch, const CachePools& pools, Tensor logits) {
    const Tensor rows = ops.scratch(batch.n_logit_rows(), config().hidden_size, DType::F32);  // [R, hidden]
    forward_body(ops, batch, pools, rows);
    forward_head(ops, rows, logits);
  }

 public:
  // The vision tower (kimi_k3 with vision_tower.* weights): the rows that replace the
  // prompt's media placeholder run for `images`, in prompt order, [sum of num_tokens,
  // hidden] F32 on the host. A forward takes them through ForwardBatch::embed_rows.
  virtual bool has_vision() const { return false; }
  // Patch rows one encode_images call may take on a backend whose step scratch is a fixed
  // arena: scratch_bytes() sets aside room for this many (4 per prompt token of a step:
  // an image whose merged rows fit one prefill chunk fits the tower).
  static int64_t max_image_patches(int tokens_per_step) { return 4 * static_cast<int64_t>(std::max(tokens_per_step, 1)); }
  virtual std::vector<float> encode_images(Ops& ops, std::span<const vision::ImagePatches* const> images) {
    throw BackendError("this model has no vision tower");
  }
  // Speculative decoding rolls a sequence's recurrent state back to a snapshot and advances
  // it over the accepted prefix of the tokens it verified, from what the verifying forward
  // saved (the rows listed in ForwardBatch::save_rows, into pools.replay): replaying the
  // accepted inputs costs a few small ops per layer, where a snapshot per draft position
  // would copy the whole state k times a step. Floats saved per token over all layers; 0:
  // the model keeps no recurrent state (its caches roll back by length alone).
  virtual int64_t replay_floats_per_token() const { return 0; }
  // DSpark drafts read the outputs of some of the target's layers: once set, every forward
  // copies layer layers[j]'s output row of each token t to pools.taps row
  // j * pools.taps_stride_rows + t (CachePools::taps; the stride >= the step's tokens).
  // False: this model cannot.
  virtual bool set_taps(std::vector<int> layers) { return false; }
  // The weights a draft shares; empty where this rank holds only a part of them.
  virtual DraftSharedWeights draft_shared() const { return {}; }
  // Advances the state slots of `batch`'s sequences (already restored to their snapshots)
  // over their tokens, token i taking what saved row batch.token_ids[i] of pools.replay
  // holds (a replay reads no token: its "ids" are saved rows, uploaded with the batch, so a
  // captured graph replays with new rows). Only the recurrent state is written (no cache
  // rows, no logits); nothing is read from the host, so the ops may be captured.
  virtual void replay_state(Ops& ops, const BatchView& batch, const CachePools& pools) {}
  // What a captured graph of `batch`'s step depends on besides the step's sequences and
  // tokens each (the runner's graph key): a step whose value differs runs another graph.
  // K3.1's DSA layers size their index scores by the context (a power of two at least the
  // longest sequence's positions: layers/dsa.h, dsa_score_columns), so their graphs are one
  // per such width; 0 for a model whose step shapes do not depend on the contexts.
  virtual uint32_t graph_variant(const ForwardBatch& batch) const { return 0; }
  // The positions its forward can take (a table per position), 0 for no bound: the runner
  // refuses a step past it rather than read outside the table.
  virtual int64_t max_positions() const { return 0; }
  // Bytes of weights this rank holds on the backend.
  virtual size_t weight_bytes() const = 0;
  // Step temporaries a backend with a fixed arena must set aside: the scratch of a step of
  // tokens_per_step new tokens, whatever the contexts they attend to (nothing a step keeps
  // grows with the context: ops.h, mla_prefill_key_block).
  virtual int64_t scratch_bytes(int tokens_per_step) const = 0;
};

// Whether the model's heads, vocabulary and experts split over tp_size ranks in ep_size
// expert groups (the dimension that does not, named). The loader checks the rest per tensor.
Status check_parallel_split(const ModelConfig& cfg, int tp_size, int ep_size, bool dp_attention = false);

// Loads the text model of `ckpt` onto `ops`'s backend (config.json's architecture decides
// which model). Errors name the file, the tensor and the problem.
Result<std::unique_ptr<Model>> load_model(Ops& ops, const Checkpoint& ckpt, const LoadOptions& options = {});

}  // namespace moonrun
