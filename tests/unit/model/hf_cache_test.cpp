// Repo ids resolved in a fake Hugging Face cache laid out as huggingface_hub writes it:
// refs/main holding the commit, snapshots/COMMIT/ with relative symlinks into blobs/.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <optional>

#include "model/checkpoint.h"
#include "test_files.h"

namespace moonrun {
namespace {

namespace fs = std::filesystem;
using testing_files::le_f32;
using testing_files::safetensors_bytes;
using testing_files::TempDir;
using testing_files::write_bytes;

// Sets an environment variable for one scope; restores the old value after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::optional<std::string>& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) ::setenv(name, value->c_str(), 1);
    else ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_) ::setenv(name_, old_->c_str(), 1);
    else ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

constexpr const char* kCommit = "9f62e4e9fffbd0a83ddd60e1c209d828994b3569";
constexpr const char* kOldCommit = "1111111111111111111111111111111111111111";

// HUB/models--moonshotai--Kimi-Tiny with two snapshots; refs/main -> kCommit.
void make_cache(const std::string& hub) {
  const std::string repo = hub + "/models--moonshotai--Kimi-Tiny";
  write_bytes(repo + "/refs/main", std::string(kCommit) + "\n");
  write_bytes(repo + "/blobs/cfgblob", R"({"model_type":"kimi_k3"})");
  write_bytes(repo + "/blobs/0123abcd",
              safetensors_bytes(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", le_f32(2)));
  for (const char* commit : {kCommit, kOldCommit}) {
    const std::string snap = repo + "/snapshots/" + commit;
    fs::create_directories(snap);
    fs::create_symlink("../../blobs/cfgblob", snap + "/config.json");
    fs::create_symlink("../../blobs/0123abcd", snap + "/model.safetensors");
  }
}

TEST(HfCache, RepoIdShape) {
  EXPECT_TRUE(looks_like_repo_id("moonshotai/Kimi-K3"));
  EXPECT_TRUE(looks_like_repo_id("moonshotai/Kimi-K3@main"));
  EXPECT_TRUE(looks_like_repo_id("org/name.v2@refs/pr/1"));
  EXPECT_FALSE(looks_like_repo_id("/abs/path"));
  EXPECT_FALSE(looks_like_repo_id("./rel/path"));
  EXPECT_FALSE(looks_like_repo_id("a/b/c"));
  EXPECT_FALSE(looks_like_repo_id("name"));
  EXPECT_FALSE(looks_like_repo_id("org/name@"));
  EXPECT_FALSE(looks_like_repo_id("../x"));
}

TEST(HfCache, HubDirFromEnvironment) {
  ScopedEnv a("HF_HUB_CACHE", std::nullopt), b("HF_HOME", std::nullopt), c("XDG_CACHE_HOME", std::nullopt),
      d("HOME", "/home/u");
  EXPECT_EQ(hf_hub_cache_dir(), "/home/u/.cache/huggingface/hub");
  {
    ScopedEnv x("XDG_CACHE_HOME", "/xdg");
    EXPECT_EQ(hf_hub_cache_dir(), "/xdg/huggingface/hub");
  }
  {
    ScopedEnv h("HF_HOME", "/ephemeral/hf/");
    EXPECT_EQ(hf_hub_cache_dir(), "/ephemeral/hf/hub");
    ScopedEnv hub("HF_HUB_CACHE", "/elsewhere");
    EXPECT_EQ(hf_hub_cache_dir(), "/elsewhere");
  }
}

TEST(HfCache, ResolvesRefsMainThroughHfHome) {
  TempDir tmp;
  make_cache(tmp / "hub");
  ScopedEnv h("HF_HOME", tmp.path()), hub("HF_HUB_CACHE", std::nullopt);
  auto p = resolve_model_path("moonshotai/Kimi-Tiny");
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  EXPECT_EQ(*p, tmp / "hub/models--moonshotai--Kimi-Tiny/snapshots/" + kCommit);

  // The whole checkpoint opens through the symlinks.
  auto ck = Checkpoint::open("moonshotai/Kimi-Tiny");
  ASSERT_TRUE(ck.is_ok()) << ck.status().message();
  EXPECT_EQ((*ck)->config()["model_type"], "kimi_k3");
  EXPECT_NE((*ck)->find("w"), nullptr);

  auto loc = resolve_hf_cache("moonshotai/Kimi-Tiny");
  ASSERT_TRUE(loc.is_ok());
  EXPECT_EQ(loc->commit, kCommit);
  EXPECT_EQ(loc->revision, "main");
  EXPECT_EQ(loc->repo_dir, tmp / "hub/models--moonshotai--Kimi-Tiny");
}

TEST(HfCache, RevisionAsCommitOrRef) {
  TempDir tmp;
  make_cache(tmp / "hub");
  write_bytes(tmp / "hub/models--moonshotai--Kimi-Tiny/refs/stable", kOldCommit);
  ScopedEnv h("HF_HOME", tmp.path()), hub("HF_HUB_CACHE", std::nullopt);
  auto by_commit = resolve_model_path(std::string("moonshotai/Kimi-Tiny@") + kOldCommit);
  ASSERT_TRUE(by_commit.is_ok()) << by_commit.status().message();
  EXPECT_EQ(fs::path(*by_commit).filename(), kOldCommit);
  auto by_ref = resolve_model_path("moonshotai/Kimi-Tiny@stable");
  ASSERT_TRUE(by_ref.is_ok()) << by_ref.status().message();
  EXPECT_EQ(fs::path(*by_ref).filename(), kOldCommit);
  auto bad = resolve_model_path("moonshotai/Kimi-Tiny@v9");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("refs/v9"), std::string::npos) << bad.status().message();
}

TEST(HfCache, HubCacheOverridesHfHome) {
  TempDir tmp;
  make_cache(tmp / "custom-hub");
  ScopedEnv h("HF_HOME", tmp / "unused"), hub("HF_HUB_CACHE", tmp / "custom-hub");
  auto p = resolve_model_path("moonshotai/Kimi-Tiny");
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  EXPECT_EQ(*p, tmp / "custom-hub/models--moonshotai--Kimi-Tiny/snapshots/" + kCommit);
}

TEST(HfCache, Errors) {
  TempDir tmp;
  make_cache(tmp / "hub");
  ScopedEnv h("HF_HOME", tmp.path()), hub("HF_HUB_CACHE", std::nullopt);
  auto absent = resolve_model_path("moonshotai/Kimi-Huge");
  ASSERT_FALSE(absent.is_ok());
  EXPECT_EQ(absent.status().code(), StatusCode::kNotFound);
  EXPECT_NE(absent.status().message().find("models--moonshotai--Kimi-Huge"), std::string::npos);
  EXPECT_NE(absent.status().message().find("HF_HOME"), std::string::npos);

  // refs/main names a snapshot that is not there (interrupted download).
  write_bytes(tmp / "hub/models--moonshotai--Kimi-Tiny/refs/main", "deadbeef\n");
  auto dangling = resolve_model_path("moonshotai/Kimi-Tiny");
  ASSERT_FALSE(dangling.is_ok());
  EXPECT_NE(dangling.status().message().find("deadbeef"), std::string::npos) << dangling.status().message();

  fs::remove(tmp / "hub/models--moonshotai--Kimi-Tiny/refs/main");
  auto no_ref = resolve_model_path("moonshotai/Kimi-Tiny");
  ASSERT_FALSE(no_ref.is_ok());
  EXPECT_NE(no_ref.status().message().find("refs/main is missing"), std::string::npos) << no_ref.status().message();
}

TEST(HfCache, ExistingDirectoryWinsOverRepoId) {
  TempDir tmp;
  fs::create_directories(tmp / "org/name");
  auto cwd = fs::current_path();
  fs::current_path(tmp.path());
  auto p = resolve_model_path("org/name");
  fs::current_path(cwd);
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  EXPECT_EQ(*p, "org/name");
}

}  // namespace
}  // namespace moonrun
