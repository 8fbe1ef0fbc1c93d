// `moonrun verify` as a user runs it on a local directory (issue 15): a positional path,
// --json, exit codes, and --hash that catches a flipped byte through a manifest that
// `verify --write-manifest` wrote or through `hf download --local-dir` metadata; sizes of a
// small checkpoint never print as 0.00 GB.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "tools/verify.h"

namespace moonrun {
namespace {

namespace fs = std::filesystem;

std::string verify(const std::string& args, int* rc) {
  std::string out;
  FILE* p = popen((std::string(MOONRUN_EXE) + " verify " + args + " 2>&1").c_str(), "r");
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  *rc = WEXITSTATUS(pclose(p));
  return out;
}

std::string demo_copy(const std::string& name) {
  const std::string dir = testing::TempDir() + "/" + name;
  fs::remove_all(dir);
  EXPECT_EQ(std::system((std::string(MOONRUN_EXE) + " make-demo-model --out " + dir + " > /dev/null 2>&1").c_str()), 0);
  return dir;
}

void flip_a_byte(const std::string& path) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(-100, std::ios::end);
  char c;
  f.get(c);
  f.seekp(-100, std::ios::end);
  f.put(static_cast<char>(c ^ 0x01));
}

std::string a_shard(const std::string& dir) {
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") return e.path().string();
  return "";
}

TEST(VerifyCli, PositionalPathJsonAndHumanSizes) {
  const std::string dir = demo_copy("verify-cli-a");
  int rc = 0;
  std::string out = verify(dir, &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("RESULT: COMPLETE"), std::string::npos);
  EXPECT_EQ(out.find("0.00 GB"), std::string::npos) << out;
  EXPECT_NE(out.find(" MB)"), std::string::npos) << out;
  out = verify(dir + " --json", &rc);
  EXPECT_EQ(rc, 0) << out;
  auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["result"], "COMPLETE");
  EXPECT_GT(j["total_bytes"].get<uint64_t>(), 0u);
  out = verify("/nonexistent/checkpoint", &rc);
  EXPECT_EQ(rc, 2) << out;
  out = verify(dir + " --model-path /elsewhere", &rc);
  EXPECT_EQ(rc, 2) << out;
}

TEST(VerifyCli, HashOnALocalDirectoryNeedsAReferenceAndCatchesAFlippedByte) {
  const std::string dir = demo_copy("verify-cli-b");
  int rc = 0;
  // No reference yet: --hash must not pass silently.
  std::string out = verify(dir + " --hash", &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("--write-manifest"), std::string::npos) << out;
  out = verify(dir + " --write-manifest", &rc);
  EXPECT_EQ(rc, 0) << out;
  ASSERT_TRUE(fs::exists(dir + "/moonrun-manifest.json"));
  out = verify(dir + " --hash", &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("files match"), std::string::npos) << out;
  flip_a_byte(a_shard(dir));
  out = verify(dir + " --hash --json", &rc);
  EXPECT_EQ(rc, 1) << out;
  auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["result"], "INCOMPLETE");
  EXPECT_NE(j["problems"].dump().find("corrupt"), std::string::npos) << out;
}

TEST(VerifyCli, HashUsesHfLocalDirMetadata) {
  const std::string dir = demo_copy("verify-cli-c");
  // What `hf download --local-dir` leaves: .cache/huggingface/download/<file>.metadata with
  // the commit on line 1 and the etag (an LFS file's SHA-256) on line 2.
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    auto h = hash_file(e.path().string(), true, false);
    ASSERT_TRUE(h.is_ok());
    fs::create_directories(dir + "/.cache/huggingface/download");
    std::ofstream(dir + "/.cache/huggingface/download/" + e.path().filename().string() + ".metadata")
        << "9f62e4e9fffbd0a83ddd60e1c209d828994b3569\n" << h->sha256_hex << "\n1764000000.0\n";
  }
  int rc = 0;
  std::string out = verify(dir + " --hash", &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("--local-dir metadata"), std::string::npos) << out;
  flip_a_byte(a_shard(dir));
  out = verify(dir + " --hash", &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("corrupt"), std::string::npos) << out;
}

}  // namespace
}  // namespace moonrun
