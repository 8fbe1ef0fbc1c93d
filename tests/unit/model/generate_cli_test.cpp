// `moonrun generate` error paths: each exits non-zero with one line on stderr naming the
// input and the problem, and prints nothing on stdout.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

namespace {

struct RunResult {
  int exit_code = -1;
  std::string out, err;
};

RunResult run(const std::string& args) {
  const std::string err_file = (std::filesystem::temp_directory_path() / ("moonrun_gen_err_" + std::to_string(getpid()))).string();
  const std::string cmd = std::string(MOONRUN_EXE) + " generate " + args + " 2>" + err_file;
  RunResult r;
  FILE* p = popen(cmd.c_str(), "r");
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), p)) r.out.append(buf, n);
  int st = pclose(p);
  r.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  std::ifstream e(err_file);
  r.err.assign(std::istreambuf_iterator<char>(e), {});
  std::filesystem::remove(err_file);
  return r;
}

void expect_one_line_error(const RunResult& r, const std::string& fragment) {
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(r.out.empty()) << r.out;
  ASSERT_FALSE(r.err.empty());
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << r.err;  // exactly one line
  EXPECT_NE(r.err.find(fragment), std::string::npos) << r.err;
}

const std::string kDemo = std::string(MOONRUN_BINARY_DIR) + "/demo-model";

TEST(GenerateCliErrors, BadTokenIds) {
  expect_one_line_error(run("--model " + kDemo + " --token-ids 1,x,3"), "\"x\" is not a token id");
  expect_one_line_error(run("--model " + kDemo + " --token-ids 1,,3"), "is not a token id");
  expect_one_line_error(run("--model " + kDemo + " --token-ids -4"), "is not a token id");
}

TEST(GenerateCliErrors, IdOutsideTheVocabulary) {
  expect_one_line_error(run("--model " + kDemo + " --token-ids 1,999999"), "token id 999999 is outside the vocabulary");
}

TEST(GenerateCliErrors, MissingModelAndBrokenConfig) {
  namespace fs = std::filesystem;
  expect_one_line_error(run("--model /nonexistent/model-dir --token-ids 1"), "/nonexistent/model-dir");
  const std::string dir = (fs::temp_directory_path() / ("moonrun_gen_badcfg_" + std::to_string(getpid()))).string();
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(kDemo)) fs::copy_file(e.path(), dir + "/" + e.path().filename().string(), fs::copy_options::overwrite_existing);
  {
    std::ofstream c(dir + "/config.json");
    c << R"({"model_type": "llama", "hidden_size": 64})";
  }
  expect_one_line_error(run("--model " + dir + " --token-ids 1"), "model_type \"llama\" is not supported");
  fs::remove_all(dir);
}

TEST(GenerateCli, PrintsOneJsonLine) {
  RunResult r = run("--model " + kDemo + " --token-ids 5,6,7 --max-tokens 3");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("{\"prompt_tokens\":3,\"token_ids\":[", 0), 0u) << r.out;
  EXPECT_EQ(r.out.find('\n'), r.out.size() - 1);
}

}  // namespace
