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

// The fixtures the CUDA backend runs: all of them. (K3.1's were left out while its DSA
// layers sized their scores by the exact context, which a decode step captured as a graph
// then replayed at later positions: layers/dsa.h, dsa_score_columns.)
inline std::vector<std::string> cuda_fixture_names() { return fixture_names(); }

// n float32 little-endian values (a caseK.f32 logits file).
inline std::vector<float> read_f32(const std::string& path, size_t n) {
  std::vector<float> v(n);
  std::ifstream in(path, std::ios::binary);
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * sizeof(float)));
  EXPECT_TRUE(in.good()) << path << ": shorter than " << n << " floats";
  return v;
}

}  // namespace moonrun::fixtures
