#pragma once
// `moonrun bench --plot FILE.png`: latency per request over the run, throughput over time,
// the inter-token latency histogram and the latency summary, with the seed's headline
// figures on top.
#include <string>

#include "common/status.h"
#include "tools/bench.h"

namespace moonrun::tools {

Status write_bench_plot(const BenchReport& report, const std::string& path);

}  // namespace moonrun::tools
