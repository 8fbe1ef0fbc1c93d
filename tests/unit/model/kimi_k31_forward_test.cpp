// The K3.1 forward (model/kimi_k3.cpp with model/layers/dsa.h in the full-attention layers) on
// the CPU backend. The K3.1 checkpoint is the demo K3 model plus random indexers in a third
// shard, so the two share every other weight:
//   - with index_topk at least the context, every query selects every visible key, and the
//     K3.1 forward (indexer, top-k, sparse attention) must give K3's dense forward's logits,
//     prefill and cached decode: the sparse path checked against the dense one, not itself;
//   - with a small index_topk (selection really drops keys: the logits move), cached decode
//     and a later prefill chunk must give what one prefill over everything gives;
//   - the cache's indexer-key row kind: its rows, and its bytes in the bytes per token.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_ops.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/demo_model.h"
#include "model/model.h"
#include "model/synthetic_weights.h"
#include "model/weight_spec.h"

namespace moonrun {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path& k3_dir() {
  static const fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / ("moonrun_k31_fwd_k3_" + std::to_string(getpid()));
    Status st = write_demo_model(d.string(), 1024);
    MR_CHECK(st.is_ok()) << st.to_string();
    return d;
  }();
  return dir;
}

json read_json(const fs::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}

// The demo K3 checkpoint made K3.1 (DSA layers 4 and 6, 1-based: its full-attention layers;
// indexer 4 heads x 32, top `topk`), its indexers in a shard of their own.
fs::path k31_dir(int topk) {
  const fs::path dir = fs::temp_directory_path() /
                       ("moonrun_k31_fwd_" + std::to_string(topk) + "_" + std::to_string(getpid()));
  if (fs::exists(dir / "config.json")) return dir;
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(k3_dir()))
    if (e.path().filename() != "config.json" && e.path().filename() != "model.safetensors.index.json")
      fs::copy_file(e.path(), dir / e.path().filename(), fs::copy_options::overwrite_existing);
  json config = read_json(k3_dir() / "config.json");
  config["architectures"] = {"KimiK31ForConditionalGeneration"};
  config["model_type"] = "kimi_k31";
  config["text_config"]["dsa_config"] = {
      {"dsa_layers", {4, 6}}, {"index_n_heads", 4}, {"index_head_dim", 32}, {"index_topk", topk}};
  { std::ofstream(dir / "config.json") << config.dump(1); }
  auto cfg = parse_model_config(config, (dir / "config.json").string());
  MR_CHECK(cfg.is_ok()) << cfg.status().to_string();
  std::vector<TensorToWrite> indexer;
  json index = read_json(k3_dir() / "model.safetensors.index.json");
  for (const TensorSpec& t : weight_spec(*cfg)) {
    if (t.name.find(".self_attn.indexer.") == std::string::npos) continue;
    TensorToWrite w{t.name, t.dtype, t.shape, std::vector<uint8_t>(t.nbytes())};
    synthetic_bytes(t, 31, 0, t.numel(), w.bytes.data());
    indexer.push_back(std::move(w));
    index["weight_map"][t.name] = "indexer.safetensors";
  }
  MR_CHECK(indexer.size() == 10u) << indexer.size();
  MR_CHECK(write_safetensors((dir / "indexer.safetensors").string(), indexer, json{{"format", "pt"}}).is_ok());
  { std::ofstream(dir / "model.safetensors.index.json") << index.dump(1); }
  return dir;
}

// A model on the CPU backend with its own pools (every row kind its cache spec asks for).
struct Harness {
  cpu::CpuOps ops;
  std::unique_ptr<Model> model;
  CachePools pools;
  Harness(const fs::path& dir, int pages, int page_size = 16, int slots = 1) {
    auto ckpt = Checkpoint::open(dir.string());
    MR_CHECK(ckpt.is_ok()) << ckpt.status().to_string();
    auto m = load_model(ops, **ckpt);
    MR_CHECK(m.is_ok()) << m.status().to_string();
    model = std::move(m).value();
    const CacheSpec spec = model->cache_spec();
    const int64_t rows = static_cast<int64_t>(pages) * page_size;
    pools.state = ops.alloc(slots, spec.state_floats_per_slot, DType::F32, "state");
    pools.kv = ops.alloc(spec.kv_layers * rows, spec.kv_row_width, DType::F32, "kv");
    if (spec.index_layers > 0)
      pools.index_kv = ops.alloc(spec.index_layers * rows, spec.index_row_width, spec.index_dtype, "indexer keys");
    pools.num_slots = slots;
    pools.num_pages = pages;
    pools.page_size_tokens = page_size;
  }
  int vocab() const { return model->config().vocab_size; }
  std::vector<float> forward(const ForwardBatch& batch) {
    ops.reset_scratch();
    const BatchView view = ops.upload_batch(batch);
    Tensor logits = ops.scratch(view.n_logit_rows(), vocab(), DType::F32);
    model->forward(ops, view, pools, logits);
    std::vector<float> out(static_cast<size_t>(logits.numel()));
    ops.download(logits, out.data());
    return out;
  }
};

constexpr int kPages = 4;  // 64 positions in pages of 16, handed out out of order
const int32_t kPageTable[kPages] = {2, 0, 3, 1};

std::vector<int32_t> prompt_ids(int n) {
  std::vector<int32_t> ids;
  for (int i = 0; i < n; ++i) ids.push_back((i * 37 + 11) % 1024);
  return ids;
}

// Logits of every position: one prefill over all of ids.
std::vector<float> prefill_all(const fs::path& dir, const std::vector<int32_t>& ids) {
  Harness h(dir, kPages);
  ForwardBatch fb;
  fb.add_seq(ids.data(), static_cast<int>(ids.size()), 0, 0, kPageTable, kPages, /*all_logits=*/true);
  return h.forward(fb);
}

// Logits of every position from first - 1: a prefill of ids[0, first), then one token per
// forward through the caches. With chunk > 0, a second prefill chunk of that many tokens
// (all its logits) comes between them.
std::vector<float> prefill_then_decode(const fs::path& dir, const std::vector<int32_t>& ids, int first, int chunk = 0) {
  Harness h(dir, kPages);
  const int T = static_cast<int>(ids.size());
  std::vector<float> out;
  ForwardBatch fb;
  fb.add_seq(ids.data(), first, 0, 0, kPageTable, kPages);
  out = h.forward(fb);
  int t = first;
  if (chunk > 0) {
    ForwardBatch c;
    c.add_seq(&ids[t], chunk, t, 0, kPageTable, kPages, /*all_logits=*/true);
    const std::vector<float> rows = h.forward(c);
    out.insert(out.end(), rows.begin(), rows.end());
    t += chunk;
  }
  for (; t < T; ++t) {
    ForwardBatch one;
    one.add_seq(&ids[t], 1, t, 0, kPageTable, kPages);
    const std::vector<float> row = h.forward(one);
    out.insert(out.end(), row.begin(), row.end());
  }
  return out;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b, size_t from_a, size_t from_b, size_t n) {
  float m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::fabs(a[from_a + i] - b[from_b + i]));
  return m;
}

TEST(KimiK31Cpu, SelectingEveryKeyIsK3sDenseForward) {
  const int T = 40, first = 6;
  const auto ids = prompt_ids(T);
  const fs::path k31 = k31_dir(64);  // top 64 >= 40 positions: every query keeps every key
  const std::vector<float> dense = prefill_all(k3_dir(), ids), sparse = prefill_all(k31, ids);
  ASSERT_EQ(dense.size(), sparse.size());
  const float prefill_diff = max_abs_diff(dense, sparse, 0, 0, dense.size());
  EXPECT_LT(prefill_diff, 1e-4f);
  // Cached decode (absorbed MLA over the selection) against K3's cached decode.
  const std::vector<float> dense_dec = prefill_then_decode(k3_dir(), ids, first),
                           sparse_dec = prefill_then_decode(k31, ids, first);
  ASSERT_EQ(dense_dec.size(), sparse_dec.size());
  const float decode_diff = max_abs_diff(dense_dec, sparse_dec, 0, 0, dense_dec.size());
  EXPECT_LT(decode_diff, 1e-4f);
  float scale = 0;
  for (float v : dense) scale = std::max(scale, std::fabs(v));
  EXPECT_GT(scale, 0.1f);
  std::printf("K3.1 (all keys) vs K3: prefill %g, decode %g (logit scale %g)\n", prefill_diff, decode_diff, scale);
}

TEST(KimiK31Cpu, WithASmallTopKCachedDecodeMatchesOnePrefill) {
  const int T = 48, first = 5, k = 8;
  const auto ids = prompt_ids(T);
  const fs::path sparse_dir = k31_dir(k);
  const std::vector<float> all = prefill_all(sparse_dir, ids);
  const size_t V = all.size() / T;
  // The selection matters: past position k the logits leave the all-keys model's.
  const std::vector<float> every = prefill_all(k31_dir(64), ids);
  EXPECT_LT(max_abs_diff(all, every, 0, 0, k * V), 1e-4f);  // up to k visible keys: dense
  EXPECT_GT(max_abs_diff(all, every, (T - 1) * V, (T - 1) * V, V), 1e-3f);

  // Prefill of 5, decode the rest: row i of `dec` is position first - 1 + i.
  const std::vector<float> dec = prefill_then_decode(sparse_dir, ids, first);
  ASSERT_EQ(dec.size(), (T - first + 1) * V);
  const float decode_diff = max_abs_diff(dec, all, 0, (first - 1) * V, dec.size());
  EXPECT_LT(decode_diff, 1e-3f);

  // Prefill of 5, a chunk of 20 over the cached 5 (plain order, selection per row), decode on.
  const std::vector<float> chunked = prefill_then_decode(sparse_dir, ids, first, 20);
  ASSERT_EQ(chunked.size(), (T - first + 1) * V);
  const float chunk_diff = max_abs_diff(chunked, all, 0, (first - 1) * V, chunked.size());
  EXPECT_LT(chunk_diff, 1e-3f);
  std::printf("K3.1 top %d: |decode - prefill| %g, |chunked - prefill| %g\n", k, decode_diff, chunk_diff);
}

// The scores are made a block of tokens at a time (DsaDims::score_block_bytes: what bounds
// their memory at long contexts). Blocks of one row, and of 3 rows (which split the
// sequences' tokens unevenly), give one block's logits bit for bit: the rows are
// independent. Two sequences in the batch, one prefilling after a cached prefix.
TEST(KimiK31Cpu, ScoresInBlocksOfRowsChangeNothing) {
  const int k = 8;
  const auto ids = prompt_ids(48);
  const fs::path dir = k31_dir(k);
  const int32_t pages_a[2] = {0, 1}, pages_b[2] = {2, 3};
  auto run = [&](const char* block_bytes) {
    if (block_bytes) setenv("MOONRUN_DSA_SCORE_BLOCK_BYTES", block_bytes, 1);
    else unsetenv("MOONRUN_DSA_SCORE_BLOCK_BYTES");
    Harness h(dir, kPages, 16, /*slots=*/2);
    unsetenv("MOONRUN_DSA_SCORE_BLOCK_BYTES");
    ForwardBatch first;
    first.add_seq(ids.data(), 10, 0, 1, pages_b, 2);
    h.forward(first);
    ForwardBatch fb;
    fb.add_seq(ids.data(), 30, 0, 0, pages_a, 2, /*all_logits=*/true);
    fb.add_seq(&ids[10], 20, 10, 1, pages_b, 2, /*all_logits=*/true);
    return h.forward(fb);
  };
  // 256 columns of 4 bytes: 1 KiB a row.
  const std::vector<float> whole = run(nullptr), rows1 = run("1"), rows3 = run("3072");
  ASSERT_EQ(whole.size(), rows1.size());
  ASSERT_EQ(whole.size(), rows3.size());
  EXPECT_EQ(whole, rows1);
  EXPECT_EQ(whole, rows3);
}

TEST(KimiK31Cpu, TheIndexerKeysAreARowKindOfThePagedCache) {
  cpu::CpuOps ops;
  auto ckpt = Checkpoint::open(k31_dir(64).string());
  ASSERT_TRUE(ckpt.is_ok());
  auto m = load_model(ops, **ckpt);
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  const CacheSpec spec = (*m)->cache_spec();
  // The demo's two full-attention layers: latent rows of 64 + 16, indexer keys of 32 (F32 on the CPU).
  EXPECT_EQ(spec.kv_layers, 2);
  EXPECT_EQ(spec.kv_row_width, 80);
  EXPECT_EQ(spec.index_layers, 2);
  EXPECT_EQ(spec.index_row_width, 32);
  EXPECT_EQ(spec.index_dtype, DType::F32);
  EXPECT_EQ(spec.index_bytes_per_token(), 2 * 32 * 4);
  EXPECT_EQ(spec.kv_bytes_per_token(DType::BF16), 2 * 80 * 2 + 2 * 32 * 4);
  EXPECT_EQ(spec.kv_bytes_per_token(DType::F32), 2 * 80 * 4 + 2 * 32 * 4);
  // K3 keeps no indexer rows.
  auto k3 = Checkpoint::open(k3_dir().string());
  ASSERT_TRUE(k3.is_ok());
  auto m3 = load_model(ops, **k3);
  ASSERT_TRUE(m3.is_ok());
  EXPECT_EQ((*m3)->cache_spec().index_layers, 0);
  EXPECT_EQ((*m3)->cache_spec().kv_bytes_per_token(DType::F32), 2 * 80 * 4);
}

}  // namespace
}  // namespace moonrun
