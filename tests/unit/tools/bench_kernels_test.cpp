// bench-model --kernels' table: what a reader decides from it is whether each kernel meets
// issue #12's bar, so a ratio that misses must not print as the bar, and a shape without a
// peer figure must not print a ratio of 0.
#include "tools/bench_kernels.h"

#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

namespace moonrun::tools {
namespace {

std::vector<std::string> rows(const std::string& table) {
  std::vector<std::string> out;
  std::istringstream in(table);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("| kda", 0) == 0 || line.rfind("| moe", 0) == 0) out.push_back(line);
  return out;
}

KernelFigure figure(std::string kernel, double ms, double peer_ms, double bar) {
  KernelFigure f;
  f.kernel = std::move(kernel);
  f.shape = "s";
  f.ms = ms;
  f.bytes = 1e9;
  f.peer_ms = peer_ms;
  f.peer = peer_ms > 0 ? "p" : "";
  f.bar = bar;
  return f;
}

TEST(KernelBenchTable, AMissJustUnderTheBarShowsThreeDecimalsAndNoMet) {
  // 2.930 / 2.444 = 1.1988: "1.20x" beside a 1.2x bar read as met in a real run.
  const auto r = rows(format_kernel_bench({figure("kda chunked", 2.444, 2.930, 1.2)}, 4000));
  ASSERT_EQ(r.size(), 1u);
  EXPECT_NE(r[0].find("| 2.930 | 1.199x | 1.2x |"), std::string::npos) << r[0];
}

TEST(KernelBenchTable, MetAndClearMissesKeepTwoDecimals) {
  const auto r = rows(format_kernel_bench(
      {figure("kda chunked", 2.380, 2.930, 1.2), figure("moe_experts mxfp4", 0.142, 0.405, 3.0)}, 4000));
  ASSERT_EQ(r.size(), 2u);
  EXPECT_NE(r[0].find("| 1.23x | 1.2x met |"), std::string::npos) << r[0];
  EXPECT_NE(r[1].find("| 2.85x | 3.0x |"), std::string::npos) << r[1];
}

TEST(KernelBenchTable, NoPeerFigureShowsDashesNotZero) {
  const auto r = rows(format_kernel_bench({figure("moe_experts mxfp4", 0.130, 0, 3.0)}, 4000));
  ASSERT_EQ(r.size(), 1u);
  EXPECT_NE(r[0].find("| - | - | 3.0x |"), std::string::npos) << r[0];
  EXPECT_EQ(r[0].find("0.00x"), std::string::npos) << r[0];
}

}  // namespace
}  // namespace moonrun::tools
