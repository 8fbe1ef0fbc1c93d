// `--device` as a user meets it on a machine without a GPU (CI): `cuda` is refused with one
// clear line and exit code 2, whether the build has the CUDA backend (no device visible) or
// not (nvcc absent at configure time); `auto` and `cpu` run on the CPU. On a GPU machine
// the refusal cases skip (scripts/gpu-check.sh covers --device cuda there).
#include <sys/wait.h>

#include <cstdio>
#include <string>

#include <gtest/gtest.h>

#if MOONRUN_HAS_CUDA
#include "backend/cuda/common/device_info.h"
#endif

namespace moonrun {
namespace {

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

CommandResult run_moonrun(const std::string& args) {
  const std::string cmd = std::string(MOONRUN_EXE) + " " + args + " 2>&1";
  CommandResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) r.output.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

bool gpu_visible() {
#if MOONRUN_HAS_CUDA
  return cuda::device_count() > 0;
#else
  return false;
#endif
}

const std::string kModel = std::string(MOONRUN_SOURCE_DIR) + "/tests/fixtures/k3-tiny-a";

TEST(DeviceFlag, GenerateOnCudaWithoutAGpuIsAClearUsageError) {
  if (gpu_visible()) GTEST_SKIP() << "a GPU is visible: --device cuda runs";
  const CommandResult r = run_moonrun("generate --device cuda --model " + kModel + " --token-ids 1,2,3 --max-tokens 2");
  EXPECT_EQ(r.exit_code, 2) << r.output;
#if MOONRUN_HAS_CUDA
  EXPECT_NE(r.output.find("--device cuda: no CUDA device is visible; use --device cpu"), std::string::npos) << r.output;
#else
  EXPECT_NE(r.output.find("--device cuda: this build has no CUDA backend"), std::string::npos) << r.output;
#endif
}

TEST(DeviceFlag, ServeOnCudaWithoutAGpuIsAClearUsageError) {
  if (gpu_visible()) GTEST_SKIP() << "a GPU is visible: --device cuda runs";
  const CommandResult r = run_moonrun("serve --device cuda --port 0 --model-path " + kModel);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("moonrun serve: --device cuda:"), std::string::npos) << r.output;
}

TEST(DeviceFlag, AutoAndCpuGiveTheSameTokens) {
  if (gpu_visible()) GTEST_SKIP() << "auto picks cuda here, whose bf16 tokens may differ";
  const std::string args = " --model " + kModel + " --token-ids 5,6,7,8 --max-tokens 4";
  const CommandResult cpu = run_moonrun("generate --device cpu" + args);
  const CommandResult autod = run_moonrun("generate --device auto" + args);
  ASSERT_EQ(cpu.exit_code, 0) << cpu.output;
  ASSERT_EQ(autod.exit_code, 0) << autod.output;
  EXPECT_EQ(cpu.output, autod.output);
  EXPECT_NE(cpu.output.find("\"token_ids\""), std::string::npos) << cpu.output;
}

TEST(DeviceFlag, AnUnknownDeviceIsRefused) {
  const CommandResult r = run_moonrun("generate --device tpu --model " + kModel + " --token-ids 1 --max-tokens 1");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--device"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace moonrun
