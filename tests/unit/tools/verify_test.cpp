// `moonrun verify` on a fake HF cache laid out as huggingface_hub writes it: a tiny
// K3-shaped checkpoint in two shards, blobs named by their SHA-256 (computed with coreutils'
// sha256sum) or git blob id (computed with `git hash-object`), snapshot symlinks, refs/main.
// Then the damage the issue names: a truncated shard, a missing shard, one flipped byte.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "model/checkpoint.h"
#include "model/config.h"
#include "model/weight_spec.h"
#include "tools/verify.h"

namespace moonrun {
namespace {

namespace fs = std::filesystem;

// A small but complete kimi_k3 config: 2 layers (KDA then MLA), MoE with MXFP4 experts.
const char* kTinyConfig = R"({
  "architectures": ["KimiK3ForConditionalGeneration"],
  "model_type": "kimi_k3",
  "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3, "media_placeholder_token_id": 4,
  "tie_word_embeddings": false,
  "text_config": {
    "model_type": "kimi_linear",
    "vocab_size": 64, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
    "num_attention_heads": 2, "num_key_value_heads": 2,
    "hidden_act": "situ", "activation_situ_beta": 4.0, "activation_situ_linear_beta": 25.0,
    "rms_norm_eps": 1e-05, "max_position_embeddings": 4096,
    "q_lora_rank": 16, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8,
    "v_head_dim": 8, "mla_use_nope": true, "mla_use_output_gate": true,
    "linear_attn_config": {"full_attn_layers": [2], "kda_layers": [1], "num_heads": 2,
                           "head_dim": 8, "short_conv_kernel_size": 4, "gate_lower_bound": -5.0,
                           "use_full_rank_gate": true},
    "attn_res_block_size": 1,
    "num_experts": 4, "num_experts_per_token": 2, "num_shared_experts": 1,
    "moe_intermediate_size": 32, "routed_expert_hidden_size": 32, "latent_moe_use_norm": true,
    "first_k_dense_replace": 1, "moe_layer_freq": 1, "moe_renormalize": true,
    "moe_router_activation_func": "sigmoid", "routed_scaling_factor": 1.0,
    "use_grouped_topk": true, "num_expert_group": 1, "topk_group": 1,
    "quantization_config": {
      "quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized",
      "config_groups": {"group_0": {"weights": {"num_bits": 4, "group_size": 32, "type": "float",
                                                "strategy": "group"}, "targets": ["Linear"]}}
    }
  }
})";

constexpr const char* kCommit = "0123456789abcdef0123456789abcdef01234567";

std::string run_capture(const std::string& cmd, int* exit_code = nullptr) {
  std::string out;
  std::FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int st = ::pclose(p);
  if (exit_code != nullptr) *exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return out;
}

std::string first_word(const std::string& s) { return s.substr(0, s.find_first_of(" \t\n")); }

class FakeCache {
 public:
  FakeCache() {
    std::string tmpl = (fs::temp_directory_path() / "moonrun_verify_XXXXXX").string();
    root_ = ::mkdtemp(tmpl.data());
    repo_dir_ = root_ + "/hub/models--moonshotai--Kimi-Tiny";
    snap_ = repo_dir_ + "/snapshots/" + kCommit;
    fs::create_directories(repo_dir_ + "/blobs");
    fs::create_directories(repo_dir_ + "/refs");
    fs::create_directories(snap_);
    std::ofstream(repo_dir_ + "/refs/main") << kCommit;

    auto cfg = parse_model_config(nlohmann::json::parse(kTinyConfig), "tiny config");
    EXPECT_TRUE(cfg.is_ok()) << cfg.status().message();
    // The expected inventory, split into two shards; bytes are a counter pattern so a flipped
    // byte changes content.
    std::vector<TensorToWrite> shard[2];
    nlohmann::json weight_map = nlohmann::json::object();
    int i = 0;
    for (const auto& t : weight_spec(*cfg)) {
      TensorToWrite w{t.name, t.dtype, t.shape, std::vector<uint8_t>(t.nbytes())};
      for (size_t b = 0; b < w.bytes.size(); ++b) w.bytes[b] = static_cast<uint8_t>(b * 7 + i);
      shard[i % 2].push_back(std::move(w));
      weight_map[t.name] = shard_name(i % 2);
      ++i;
    }
    n_tensors_ = i;
    for (int s = 0; s < 2; ++s) {
      const std::string tmp = root_ + "/tmp.safetensors";
      EXPECT_TRUE(write_safetensors(tmp, shard[s]).is_ok());
      add_blob(tmp, shard_name(s), /*lfs=*/true);
    }
    write_small("config.json", kTinyConfig);
    write_small("model.safetensors.index.json",
                nlohmann::json({{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}}).dump(2));
  }
  ~FakeCache() {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }

  static std::string shard_name(int s) { return "model-0000" + std::to_string(s + 1) + "-of-00002.safetensors"; }
  std::string hf_home() const { return root_; }
  std::string snapshot(const std::string& file = "") const { return file.empty() ? snap_ : snap_ + "/" + file; }
  std::string blob_of(const std::string& file) const { return fs::canonical(snapshot(file)).string(); }
  int n_tensors() const { return n_tensors_; }

  VerifyReport verify(bool hash) const {
    VerifyOptions opt;
    opt.model = "moonshotai/Kimi-Tiny";
    opt.hash = hash;
    opt.progress = nullptr;
    ::setenv("HF_HOME", root_.c_str(), 1);
    ::unsetenv("HF_HUB_CACHE");
    auto r = verify_checkpoint(opt);
    EXPECT_TRUE(r.is_ok()) << r.status().message();
    return r.is_ok() ? *r : VerifyReport{};
  }

  // `moonrun verify ARGS` with this cache as HF_HOME: stdout, and the exit code.
  std::string run(const std::string& args, int* exit_code) const {
    return run_capture("env -u HF_HUB_CACHE HF_HOME='" + root_ + "' '" MOONRUN_EXE "' verify " + args +
                           " 2>/dev/null",
                       exit_code);
  }

 private:
  // Moves `tmp` into blobs/ under its content address and links the snapshot to it.
  void add_blob(const std::string& tmp, const std::string& name, bool lfs) {
    const std::string address = first_word(
        run_capture(lfs ? "sha256sum '" + tmp + "'" : "git hash-object --no-filters '" + tmp + "'"));
    EXPECT_EQ(address.size(), lfs ? 64u : 40u) << address;
    fs::rename(tmp, repo_dir_ + "/blobs/" + address);
    fs::create_symlink("../../blobs/" + address, snap_ + "/" + name);
  }
  void write_small(const std::string& name, const std::string& text) {
    const std::string tmp = root_ + "/tmp.txt";
    std::ofstream(tmp, std::ios::binary) << text;
    add_blob(tmp, name, /*lfs=*/false);
  }

  std::string root_, repo_dir_, snap_;
  int n_tensors_ = 0;
};

bool has_problem(const VerifyReport& r, const std::string& needle) {
  for (const auto& p : r.problems)
    if (p.find(needle) != std::string::npos) return true;
  return false;
}

std::string problems(const VerifyReport& r) {
  std::string s;
  for (const auto& p : r.problems) s += p + "\n";
  return s;
}

TEST(Verify, GoodCheckpointIsComplete) {
  FakeCache cache;
  VerifyReport r = cache.verify(/*hash=*/true);
  EXPECT_TRUE(r.complete()) << problems(r);
  EXPECT_EQ(r.repo, "moonshotai/Kimi-Tiny");
  EXPECT_EQ(r.snapshot_dir, cache.snapshot());
  EXPECT_EQ(r.shards_expected, 2);
  EXPECT_EQ(r.shards_present, 2);
  EXPECT_EQ(r.headers_ok, 2);
  EXPECT_EQ(r.tensors_in_headers, static_cast<uint64_t>(cache.n_tensors()));
  EXPECT_EQ(r.total_bytes, fs::file_size(cache.blob_of(FakeCache::shard_name(0))) +
                               fs::file_size(cache.blob_of(FakeCache::shard_name(1))));
  // Two shards (sha256) + config.json and the index (git blob ids).
  EXPECT_EQ(r.hash_checked, 4);
  EXPECT_EQ(r.hash_matched, 4);

  int rc = -1;
  const std::string out = cache.run("--model moonshotai/Kimi-Tiny --hash", &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("repo             : moonshotai/Kimi-Tiny\n"), std::string::npos) << out;
  EXPECT_NE(out.find("snapshot dir     : " + cache.snapshot() + "\n"), std::string::npos) << out;
  EXPECT_NE(out.find("safetensors      : 2/2 present\n"), std::string::npos) << out;
  EXPECT_NE(out.find("config.json      : OK\n"), std::string::npos) << out;
  EXPECT_NE(out.find(".incomplete files: 0\n"), std::string::npos) << out;
  EXPECT_NE(out.find("4/4 blobs match"), std::string::npos) << out;
  EXPECT_NE(out.find("tensors match config.json (kimi_k3)"), std::string::npos) << out;
  EXPECT_EQ(out.substr(out.size() - 17), "RESULT: COMPLETE\n") << out;

  // The snapshot directory given directly is the same checkpoint (and still in the cache).
  const std::string out_dir = cache.run("--model '" + cache.snapshot() + "'", &rc);
  EXPECT_EQ(rc, 0) << out_dir;
  EXPECT_NE(out_dir.find("repo             : moonshotai/Kimi-Tiny\n"), std::string::npos) << out_dir;
}

TEST(Verify, TruncatedShardIsCaught) {
  FakeCache cache;
  const std::string blob = cache.blob_of(FakeCache::shard_name(1));
  fs::resize_file(blob, fs::file_size(blob) - 100);
  VerifyReport r = cache.verify(false);
  EXPECT_FALSE(r.complete());
  EXPECT_EQ(r.shards_present, 2);
  EXPECT_EQ(r.headers_ok, 1);
  EXPECT_TRUE(has_problem(r, FakeCache::shard_name(1))) << problems(r);
  EXPECT_TRUE(has_problem(r, "past the end")) << problems(r);

  int rc = -1;
  const std::string out = cache.run("--model moonshotai/Kimi-Tiny", &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("RESULT: INCOMPLETE"), std::string::npos) << out;
  EXPECT_NE(out.find(FakeCache::shard_name(1)), std::string::npos) << out;
}

TEST(Verify, MissingShardIsCaught) {
  FakeCache cache;
  fs::remove(cache.snapshot(FakeCache::shard_name(0)));
  VerifyReport r = cache.verify(false);
  EXPECT_FALSE(r.complete());
  EXPECT_EQ(r.shards_expected, 2);
  EXPECT_EQ(r.shards_present, 1);
  EXPECT_TRUE(has_problem(r, FakeCache::shard_name(0) + ": missing")) << problems(r);

  int rc = -1;
  const std::string out = cache.run("--model moonshotai/Kimi-Tiny", &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("safetensors      : 1/2 present\n"), std::string::npos) << out;
}

TEST(Verify, DanglingLinkIsAMissingShard) {
  FakeCache cache;
  fs::remove(cache.blob_of(FakeCache::shard_name(0)));
  VerifyReport r = cache.verify(false);
  EXPECT_EQ(r.shards_present, 1);
  EXPECT_TRUE(has_problem(r, "dangling link")) << problems(r);
}

TEST(Verify, FlippedByteIsCaughtOnlyByHash) {
  FakeCache cache;
  const std::string blob = cache.blob_of(FakeCache::shard_name(0));
  {
    std::fstream f(blob, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-5, std::ios::end);  // inside the last tensor's data, not the header
    char c;
    f.get(c);
    f.seekp(-5, std::ios::end);
    f.put(static_cast<char>(c ^ 0x01));
  }
  EXPECT_TRUE(cache.verify(false).complete());  // structure intact
  VerifyReport r = cache.verify(true);
  EXPECT_FALSE(r.complete());
  EXPECT_EQ(r.hash_matched, 3);
  EXPECT_TRUE(has_problem(r, FakeCache::shard_name(0) + ": sha256")) << problems(r);

  int rc = -1;
  const std::string out = cache.run("--model moonshotai/Kimi-Tiny --hash", &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("3/4 blobs match"), std::string::npos) << out;
}

TEST(Verify, IncompleteDownloadLeftover) {
  FakeCache cache;
  std::ofstream(fs::path(cache.blob_of("config.json")).parent_path() / "abcdef.incomplete") << "x";
  VerifyReport r = cache.verify(false);
  EXPECT_FALSE(r.complete());
  EXPECT_EQ(r.incomplete_files, 1);
  EXPECT_TRUE(has_problem(r, "abcdef.incomplete")) << problems(r);
}

TEST(Verify, IndexListsTensorTheShardLacks) {
  FakeCache cache;
  // Rewrite the index (as a plain file) with one extra entry.
  const std::string idx = cache.snapshot("model.safetensors.index.json");
  auto j = nlohmann::json::parse(std::ifstream(idx));
  j["weight_map"]["language_model.model.extra.weight"] = FakeCache::shard_name(1);
  fs::remove(idx);
  std::ofstream(idx) << j.dump();
  VerifyReport r = cache.verify(false);
  EXPECT_TRUE(has_problem(r, "language_model.model.extra.weight is listed in " + FakeCache::shard_name(1)))
      << problems(r);
}

TEST(Verify, WrongShapeAgainstConfig) {
  FakeCache cache;
  // Replace shard 1 with one whose first tensor has a different shape.
  const std::string path = cache.snapshot(FakeCache::shard_name(1));
  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.is_ok());
  std::vector<TensorToWrite> tensors;
  std::string changed;
  for (const auto& t : (*f)->tensors()) {
    TensorToWrite w{t.name, t.dtype, t.shape, std::vector<uint8_t>(t.data, t.data + t.nbytes)};
    if (changed.empty() && t.shape.size() == 2) {
      changed = t.name;
      w.shape = {t.shape[1], t.shape[0]};
      if (w.shape == t.shape) w.shape = {t.shape[0] * t.shape[1]};
    }
    tensors.push_back(std::move(w));
  }
  f->reset();
  fs::remove(path);
  ASSERT_TRUE(write_safetensors(path, tensors).is_ok());
  VerifyReport r = cache.verify(false);
  EXPECT_FALSE(r.complete());
  EXPECT_TRUE(has_problem(r, "tensor " + changed + " has dtype")) << problems(r);
  EXPECT_TRUE(has_problem(r, "(from config.json)")) << problems(r);
}

TEST(Verify, MissingConfigAndPlainDirectory) {
  FakeCache cache;
  // A plain copy of the snapshot outside any cache: no blobs, so --hash has nothing to compare.
  const std::string copy = cache.hf_home() + "/plain";
  fs::copy(cache.snapshot(), copy, fs::copy_options::recursive | fs::copy_options::copy_symlinks);
  for (const auto& e : fs::directory_iterator(copy)) {
    const auto target = fs::canonical(cache.snapshot(e.path().filename().string()));
    fs::remove(e.path());
    fs::copy_file(target, e.path());
  }
  VerifyOptions opt;
  opt.model = copy;
  opt.hash = true;
  opt.progress = nullptr;
  auto r = verify_checkpoint(opt);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  // A plain directory has no content addresses: --hash says so as a problem (issue 15: it
  // used to pass silently, so a flipped byte went unnoticed), and without --hash it is complete.
  EXPECT_FALSE(r->complete());
  EXPECT_EQ(r->hash_checked, 0);
  EXPECT_NE(problems(*r).find("not an HF cache snapshot"), std::string::npos) << problems(*r);
  opt.hash = false;
  r = verify_checkpoint(opt);
  ASSERT_TRUE(r.is_ok());
  EXPECT_TRUE(r->complete()) << problems(*r);
  opt.hash = true;

  fs::remove(copy + "/config.json");
  r = verify_checkpoint(opt);
  ASSERT_TRUE(r.is_ok());
  EXPECT_FALSE(r->config_present);
  EXPECT_TRUE(has_problem(*r, "config.json: missing")) << problems(*r);
}

TEST(Verify, UsageErrorsExitTwo) {
  FakeCache cache;
  int rc = -1;
  cache.run("", &rc);
  EXPECT_EQ(rc, 2);
  cache.run("--model moonshotai/Not-Downloaded", &rc);
  EXPECT_EQ(rc, 2);
  cache.run("--model /no/such/dir", &rc);
  EXPECT_EQ(rc, 2);
  cache.run("--model moonshotai/Kimi-Tiny --no-such-flag", &rc);
  EXPECT_EQ(rc, 2);
}

TEST(Verify, HashesMatchPublishedVectors) {
  // FIPS 180-2 "abc" and git's id for the blob "hello\n".
  const std::string path = (fs::temp_directory_path() / "moonrun_hash_vec").string();
  std::ofstream(path, std::ios::binary) << "abc";
  auto h = hash_file(path, true, false);
  ASSERT_TRUE(h.is_ok());
  EXPECT_EQ(h->sha256_hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  std::ofstream(path, std::ios::binary | std::ios::trunc) << "hello\n";
  h = hash_file(path, false, true);
  ASSERT_TRUE(h.is_ok());
  EXPECT_EQ(h->git_sha1_hex, "ce013625030ba8dba906f756967f9e9ca394464a");
  fs::remove(path);
  EXPECT_EQ(with_thousands_separators(1560936091448ull), "1,560,936,091,448");
  EXPECT_EQ(with_thousands_separators(999), "999");
  EXPECT_EQ(with_thousands_separators(1000), "1,000");
}

}  // namespace
}  // namespace moonrun
