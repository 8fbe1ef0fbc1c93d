// `moonrun bench --plot`: four panels a person can read at a glance (see bench_plot.h).
#include "tools/bench_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "tools/plot.h"

namespace moonrun::tools {

namespace {

const Rgb kBg{255, 255, 255}, kInk{40, 40, 48}, kMuted{110, 110, 120};
const Rgb kBlue{52, 101, 164}, kOrange{230, 126, 34}, kRed{200, 40, 40}, kGreen{46, 139, 87};
const Rgb kBarColors[4] = {{52, 101, 164}, {93, 156, 236}, {230, 126, 34}, {200, 40, 40}};

std::string f1(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

// A row of colour keys, right-aligned so it ends at x_right.
void legend(Canvas& c, int x_right, int y, const std::vector<std::pair<std::string, Rgb>>& items) {
  int x = x_right;
  for (const auto& [label, color] : items) x -= 20 + c.text_width(label, 2) + 24;
  x += 24;
  for (const auto& [label, color] : items) {
    c.fill_rect(x, y + 2, x + 14, y + 14, color);
    c.text(x + 20, y + 1, label, kInk, 2);
    x += 20 + c.text_width(label, 2) + 24;
  }
}

// Panel 1: each request's TTFT and end-to-end latency at the moment it started.
void latency_scatter(Canvas& c, const BenchReport& r, int l, int t, int rr, int b) {
  double x_max = std::max(r.wall_s, 1e-3), y_max = 0;
  for (const auto& q : r.requests)
    if (q.ok) y_max = std::max(y_max, (q.end_s - q.start_s) * 1e3);
  Axes a = draw_axes(c, l, t, rr, b, 0, x_max, 0, std::max(y_max, 1.0), "Latency per request",
                     "request start (s)", "ms");
  for (const auto& q : r.requests) {
    if (!q.ok) {
      c.dot(a.px(q.start_s), a.py(0), 4, kRed);
      continue;
    }
    c.dot(a.px(q.start_s), a.py((q.end_s - q.start_s) * 1e3), 3, kBlue);
    c.dot(a.px(q.start_s), a.py((q.first_token_s - q.start_s) * 1e3), 3, kOrange);
  }
  legend(c, rr, t - 34, {{"end-to-end", kBlue}, {"TTFT", kOrange}, {"failed", kRed}});
}

// Panel 2: completion tokens per second over the run, in bins. Each request's tokens are
// spread over its chunks (usage tokens / chunks), so servers that send several tokens per
// chunk are counted right.
void throughput_line(Canvas& c, const BenchReport& r, int l, int t, int rr, int b) {
  const double wall = std::max(r.wall_s, 1e-3);
  const double bin = std::max(nice_step(0, wall, 40), 1e-3);
  const int n_bins = std::max(1, int(std::ceil(wall / bin)));
  std::vector<double> tokens(size_t(n_bins), 0.0);
  for (const auto& q : r.requests) {
    if (!q.ok || q.chunk_times_s.empty()) continue;
    const double per_chunk = double(q.completion_tokens) / double(q.chunk_times_s.size());
    for (double ts : q.chunk_times_s) tokens[size_t(std::clamp(int(ts / bin), 0, n_bins - 1))] += per_chunk;
  }
  double y_max = 1;
  for (double& v : tokens) {
    v /= bin;
    y_max = std::max(y_max, v);
  }
  Axes a = draw_axes(c, l, t, rr, b, 0, n_bins * bin, 0, y_max * 1.1, "Throughput", "time (s)",
                     "tok/s");
  for (int i = 0; i < n_bins; ++i)  // light fill under the line
    c.fill_rect(int(a.px(i * bin)) + 1, int(a.py(tokens[size_t(i)])), int(a.px((i + 1) * bin)), int(a.py(0)),
                {214, 228, 245});
  for (int i = 0; i < n_bins; ++i) {
    const double y = a.py(tokens[size_t(i)]);
    c.line(a.px(i * bin), y, a.px((i + 1) * bin), y, kBlue, 2);
    if (i + 1 < n_bins) c.line(a.px((i + 1) * bin), y, a.px((i + 1) * bin), a.py(tokens[size_t(i + 1)]), kBlue, 2);
  }
  const double avg = a.py(r.aggregate_tok_per_s);
  for (double x = a.left; x < a.right; x += 12) c.line(x, avg, std::min<double>(x + 6, a.right), avg, kGreen, 2);
  legend(c, rr, t - 34, {{"per " + f1("%g", bin) + " s", kBlue}, {"average " + f1("%.1f", r.aggregate_tok_per_s), kGreen}});
}

// Panel 3: inter-token latency histogram (per streamed chunk), clipped at 1.5 x p99.
void itl_histogram(Canvas& c, const BenchReport& r, int l, int t, int rr, int b) {
  std::vector<double> itl;
  for (const auto& q : r.requests)
    if (q.ok)
      for (size_t k = 1; k < q.chunk_times_s.size(); ++k) itl.push_back((q.chunk_times_s[k] - q.chunk_times_s[k - 1]) * 1e3);
  const double hi = std::max(r.itl_ms.p99 * 1.5, 1e-3);
  const int n_bins = 40;
  std::vector<double> count(n_bins, 0.0);
  for (double v : itl) count[size_t(std::clamp(int(v / hi * n_bins), 0, n_bins - 1))] += 1;
  const double y_max = std::max(1.0, *std::max_element(count.begin(), count.end()));
  Axes a = draw_axes(c, l, t, rr, b, 0, hi, 0, y_max * 1.1, "Inter-token latency", "ms between streamed chunks",
                     "chunks");
  for (int i = 0; i < n_bins; ++i)
    c.fill_rect(int(a.px(i * hi / n_bins)) + 1, int(a.py(count[size_t(i)])), int(a.px((i + 1) * hi / n_bins)),
                int(a.py(0)), kBlue);
  for (const auto& [v, color] : {std::pair<double, Rgb>{r.itl_ms.median, kOrange}, {r.itl_ms.p99, kRed}})
    c.line(a.px(v), a.top, a.px(v), a.bottom, color, 2);
  legend(c, rr, t - 34, {{"median " + f1("%.2f", r.itl_ms.median), kOrange}, {"p99 " + f1("%.2f", r.itl_ms.p99), kRed}});
}

// Panel 4: mean / median / p90 / p99 of each latency, each metric on its own scale.
void summary_bars(Canvas& c, const BenchReport& r, int l, int t, int rr, int b) {
  c.text(l, t - 34, "Latency summary (ms)", kInk, 2);
  const std::pair<const char*, const Distribution*> metrics[] = {
      {"TTFT", &r.ttft_ms}, {"TPOT", &r.tpot_ms}, {"ITL", &r.itl_ms}, {"end-to-end", &r.e2e_ms}};
  const int group_h = (b - t) / 4, bar_h = (group_h - 16) / 4, label_w = 150;
  for (int m = 0; m < 4; ++m) {
    const Distribution& d = *metrics[m].second;
    const double v[4] = {d.mean, d.median, d.p90, d.p99};
    const double scale = std::max({v[0], v[1], v[2], v[3], 1e-9});
    const int gy = t + m * group_h;
    c.text(l, gy + group_h / 2 - 8, metrics[m].first, kInk, 2);
    for (int s = 0; s < 4; ++s) {
      const int y = gy + s * bar_h;
      const int w = int((rr - l - label_w - 200) * v[s] / scale);
      c.fill_rect(l + label_w, y + 2, l + label_w + std::max(w, 1), y + bar_h - 2, kBarColors[s]);
      c.text(l + label_w + std::max(w, 1) + 8, y + bar_h / 2 - 6, f1("%.2f", v[s]),
             kMuted, 2);
    }
  }
  legend(c, rr, b + 8, {{"mean", kBarColors[0]}, {"median", kBarColors[1]}, {"p90", kBarColors[2]}, {"p99", kBarColors[3]}});
}

}  // namespace

Status write_bench_plot(const BenchReport& r, const std::string& path) {
  const int W = 1600, H = 1100;
  Canvas c(W, H, kBg);
  // Headline: what was measured and the seed's figures.
  c.text(40, 22, "moonrun bench  " + r.model + "  (" + r.mode + ")", kInk, 3);
  char line[320];
  std::snprintf(line, sizeof line,
                "%lld requests ok, %lld failed   wall %.2f s   %lld completion tokens   aggregate %.1f tok/s   "
                "per stream %.1f tok/s   %.3f req/s",
                (long long)r.completed, (long long)r.failed, r.wall_s, (long long)r.completion_tokens,
                r.aggregate_tok_per_s, r.per_stream_tok_per_s, r.request_per_s);
  c.text(40, 62, line, kMuted, 2);
  const int top1 = 150, bottom1 = 560, top2 = 670, bottom2 = 1030;
  latency_scatter(c, r, 110, top1, 760, bottom1);
  throughput_line(c, r, 920, top1, 1560, bottom1);
  itl_histogram(c, r, 110, top2, 760, bottom2);
  summary_bars(c, r, 880, top2, 1560, bottom2 - 30);
  return c.write_png(path);
}

}  // namespace moonrun::tools
