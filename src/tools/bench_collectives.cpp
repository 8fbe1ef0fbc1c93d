#include "tools/bench_collectives.h"

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <exception>
#include <thread>

namespace moonrun::tools {

namespace {

constexpr int kEagerCalls = 200;
constexpr int kCapturedCalls = 20;    // in one graph
constexpr int kCapturedReplays = 20;  // of that graph
// Graph keys of their own: the model's decode graphs are keyed by batch bucket.
constexpr uint64_t kGraphKeyBase = 0xC0'11EC'0000'0000ULL;

struct Case {
  std::string what;
  int rows, cols;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Result<CollectiveBench> run_collective_bench(const std::vector<Ops*>& ranks, int hidden, int expert_width,
                                             const std::vector<int>& tokens) {
  const int W = static_cast<int>(ranks.size());
  if (W < 2) return invalid_argument("collective bench: a group of at least two ranks in this process");
  for (int r = 0; r < W; ++r)
    if (ranks[r]->parallel_size() != W || ranks[r]->parallel_rank() != r)
      return invalid_argument("collective bench: rank " + std::to_string(r) + " is rank " +
                              std::to_string(ranks[r]->parallel_rank()) + " of " +
                              std::to_string(ranks[r]->parallel_size()) + ", not of this process's " +
                              std::to_string(W));
  std::vector<Case> cases;
  for (int n : tokens) {
    cases.push_back({"hidden rows (attention / dense MLP out)", n, hidden});
    if (expert_width > 0) cases.push_back({"MoE combine (routed experts' sum)", n, expert_width});
  }
  const int max_rows = *std::max_element(tokens.begin(), tokens.end());
  const int max_cols = std::max(hidden, expert_width);

  CollectiveBench bench;
  bench.world = W;
  const bool captures = ranks[0]->captures();
  std::vector<std::vector<double>> us(W);  // per rank: eager, then captured, per case
  std::vector<std::string> errors(W);
  std::vector<int> checked(W, 0);
  std::barrier sync(W);
  auto rank_main = [&](int r) {
    Ops& ops = *ranks[r];
    try {
      ops.bind_thread();
      // One buffer a rank, as wide and as tall as the largest case, each case a view of it:
      // from the forward's scratch (the arena's rest belongs to the cache pools), released
      // when the bench is done.
      ScratchScope scope(ops);
      const Tensor buf = ops.scratch(max_rows, max_cols, DType::F32);
      const std::vector<float> zeros(static_cast<size_t>(max_rows) * max_cols, 0.0f);
      // The check: rank r contributes r + 1 everywhere; every rank must read W (W + 1) / 2.
      const std::vector<float> mine(zeros.size(), static_cast<float>(r + 1));
      ops.upload(buf, 0, mine.data(), mine.size() * sizeof(float));
      ops.all_reduce_sum(buf);
      std::vector<float> got(zeros.size());
      ops.download(buf, got.data());
      const float want = 0.5f * W * (W + 1);
      checked[r] = std::all_of(got.begin(), got.end(), [&](float v) { return v == want; });
      // Zeros from here on, so that repeated sums stay finite.
      ops.upload(buf, 0, zeros.data(), zeros.size() * sizeof(float));
      ops.synchronize();
      for (size_t ci = 0; ci < cases.size(); ++ci) {
        const Case& c = cases[ci];
        const Tensor x{buf.data, DType::F32, c.rows, c.cols};
        for (int i = 0; i < 3; ++i) ops.all_reduce_sum(x);
        ops.synchronize();
        sync.arrive_and_wait();
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < kEagerCalls; ++i) ops.all_reduce_sum(x);
        ops.synchronize();
        us[r].push_back(1e6 * seconds_since(t0) / kEagerCalls);
        if (!captures) continue;
        auto body = [&] {
          for (int i = 0; i < kCapturedCalls; ++i) ops.all_reduce_sum(x);
        };
        for (int i = 0; i < 2; ++i) ops.run_captured(kGraphKeyBase + ci, body);  // record, replay once
        ops.synchronize();
        sync.arrive_and_wait();
        t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < kCapturedReplays; ++i) ops.run_captured(kGraphKeyBase + ci, body);
        ops.synchronize();
        us[r].push_back(1e6 * seconds_since(t0) / (kCapturedReplays * kCapturedCalls));
      }
    } catch (const std::exception& e) {
      errors[r] = e.what();
      ops.abort_collectives("collective bench: rank " + std::to_string(r) + " failed");
      sync.arrive_and_drop();  // its peers do not wait for it at the barriers
    }
  };
  std::vector<std::thread> threads;
  for (int r = 1; r < W; ++r) threads.emplace_back(rank_main, r);
  rank_main(0);
  for (auto& t : threads) t.join();
  for (int r = 0; r < W; ++r)
    if (!errors[r].empty()) return internal_error("collective bench, rank " + std::to_string(r) + ": " + errors[r]);
  for (int r = 0; r < W; ++r)
    if (!checked[r])
      return internal_error("collective bench: rank " + std::to_string(r) +
                            " read a wrong sum from all_reduce_sum (each rank contributed rank + 1)");
  bench.sums_checked = true;
  bench.transport = std::string(ranks[0]->name()) == "cuda" ? "nccl" : "threads";
  size_t k = 0;
  for (const Case& c : cases) {
    for (bool captured : {false, true}) {
      if (captured && !captures) continue;
      CollectiveFigure f;
      f.op = "all_reduce_sum";
      f.what = c.what;
      f.rows = c.rows;
      f.cols = c.cols;
      f.captured = captured;
      f.us = us[0][k++];
      bench.figures.push_back(f);
    }
  }
  return bench;
}

std::string format_collective_bench(const CollectiveBench& b) {
  std::string s = "collectives, " + std::to_string(b.world) + " ranks over " + b.transport +
                  " (rank 0's mean over back-to-back calls; sums checked on every rank: " +
                  (b.sums_checked ? "ok" : "not run") + "):\n"
                  "| op | rows x cols (F32) | KB | what | eager us | in a graph us |\n"
                  "|---|---|---:|---|---:|---:|\n";
  char line[384];
  for (size_t i = 0; i < b.figures.size(); ++i) {
    const CollectiveFigure& f = b.figures[i];
    if (f.captured) continue;  // printed with its eager twin
    const CollectiveFigure* g = i + 1 < b.figures.size() && b.figures[i + 1].captured ? &b.figures[i + 1] : nullptr;
    char graph_us[32] = "-";
    if (g) std::snprintf(graph_us, sizeof graph_us, "%.1f", g->us);
    std::snprintf(line, sizeof line, "| %s | %d x %d | %.1f | %s | %.1f | %s |\n", f.op.c_str(), f.rows, f.cols,
                  f.bytes() / 1024, f.what.c_str(), f.us, graph_us);
    s += line;
  }
  return s;
}

nlohmann::json collective_bench_to_json(const CollectiveBench& b) {
  nlohmann::json figs = nlohmann::json::array();
  for (const CollectiveFigure& f : b.figures)
    figs.push_back({{"op", f.op},
                    {"what", f.what},
                    {"rows", f.rows},
                    {"cols", f.cols},
                    {"dtype", "float32"},
                    {"captured", f.captured},
                    {"us", f.us}});
  return {{"world", b.world}, {"transport", b.transport}, {"sums_checked", b.sums_checked}, {"figures", figs}};
}

}  // namespace moonrun::tools
