#pragma once
// The reference fixtures of tests/fixtures (README there), as the model tests of both
// backends read them: where they are, which there are, and their float32 logits files.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace moonrun::fixtures {

// MOONRUN_SOURCE_DIR in the environment wins over the compiled-in one: scripts/gpu-check.sh
// runs test binaries built on another machine.
inline std::string source_dir() {
  const char* env = std::getenv("MOONRUN_SOURCE_DIR");
  return env ? env : MOONRUN_SOURCE_DIR;
}
inline std::string fixtures_dir() { return source_dir() + "/tests/fixtures"; }

// Every fixture directory with an expected.json, sorted.
inline std::vector<std::string> fixture_names() {
  namespace fs = std::filesystem;
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(fixtures_dir(), ec))
    if (e.is_directory() && fs::exists(e.path() / "expected.json")) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// The fixtures the CUDA backend runs: every one but K3.1's (k31-*). Its DSA ops pass against
// the CPU one by one (DsaOpsOnAMixedBatch), but the whole model on CUDA does not yet match
// (H100, 2026-12-06: max logit error 18.8 in fp32, graphs unlike eager): issue 38's next step.
inline std::vector<std::string> cuda_fixture_names() {
  std::vector<std::string> names;
  for (std::string& n : fixture_names())
    if (n.rfind("k31-", 0) != 0) names.push_back(std::move(n));
  return names;
}

// n float32 little-endian values (a caseK.f32 logits file).
inline std::vector<float> read_f32(const std::string& path, size_t n) {
  std::vector<float> v(n);
  std::ifstream in(path, std::ios::binary);
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * sizeof(float)));
  EXPECT_TRUE(in.good()) << path << ": shorter than " << n << " floats";
  return v;
}

}  // namespace moonrun::fixtures
