// `moonrun bench` against a real HTTP server started here: a small OpenAI-style streaming
// server (cpp-httplib, Server-Sent Events) that counts what it sends: requests, tokens,
// injected HTTP 500s and mid-stream disconnects. Bench's figures must agree with its counts.
#include <httplib.h>
#include <sys/wait.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#define STB_IMAGE_STATIC
#define STB_IMAGE_IMPLEMENTATION
#include <stb/stb_image.h>

#include "tools/bench.h"

namespace moonrun::tools {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct FakeServerOptions {
  int tokens_per_chunk = 1;   // >1: a chunk carries several tokens (usage != chunk count)
  bool send_usage = true;     // honour stream_options.include_usage
  int fail_every = 0;         // every k-th request answers HTTP 500
  int disconnect_every = 0;   // every k-th request closes the stream after 2 chunks
  int token_delay_ms = 1;
  int tokenize_tokens_per_word = 0;  // 0 = no /tokenize endpoint
};

class FakeOpenAIServer {
 public:
  explicit FakeOpenAIServer(FakeServerOptions o) : o_(o) {
    srv_.Get("/v1/models", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"object":"list","data":[{"id":"fake-model","object":"model"}]})", "application/json");
    });
    if (o_.tokenize_tokens_per_word > 0)
      srv_.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
        json j = json::parse(req.body);
        res.set_content(json{{"count", words(j["prompt"].get<std::string>()) * o_.tokenize_tokens_per_word}}.dump(),
                        "application/json");
      });
    for (const char* path : {"/v1/chat/completions", "/v1/completions"})
      srv_.Post(path, [this, path](const httplib::Request& req, httplib::Response& res) { handle(req, res, path); });
    srv_.set_tcp_nodelay(true);  // as uvicorn and real servers do: no Nagle batching of tokens
    port_ = srv_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { srv_.listen_after_bind(); });
    while (!srv_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~FakeOpenAIServer() {
    srv_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

  std::atomic<int64_t> requests{0}, completed{0}, tokens_completed{0}, http500{0}, disconnects{0},
      prompt_tokens_completed{0}, usage_chunks{0};

 private:
  static int64_t words(const std::string& s) {
    std::istringstream in(s);
    std::string w;
    int64_t n = 0;
    while (in >> w) ++n;
    return n;
  }

  void handle(const httplib::Request& req, httplib::Response& res, const std::string& path) {
    const int64_t k = ++requests;
    json body = json::parse(req.body);
    if (o_.fail_every && k % o_.fail_every == 0) {
      ++http500;
      res.status = 500;
      res.set_content(R"({"error":{"message":"injected failure","type":"server_error","code":500}})",
                      "application/json");
      return;
    }
    const bool disconnect = o_.disconnect_every && k % o_.disconnect_every == 0;
    const bool chat = path == "/v1/chat/completions";
    std::string prompt = chat ? body["messages"][0]["content"].get<std::string>() : body["prompt"].get<std::string>();
    const int64_t prompt_tokens = words(prompt) * std::max(o_.tokenize_tokens_per_word, 1);
    const int64_t max_tokens = body["max_tokens"].get<int64_t>();
    const bool usage = o_.send_usage && body.contains("stream_options") &&
                       body["stream_options"].value("include_usage", false);
    auto sent = std::make_shared<int64_t>(0);
    auto chunks = std::make_shared<int64_t>(0);
    auto finished = std::make_shared<bool>(false);
    res.set_chunked_content_provider(
        "text/event-stream", [=, this](size_t, httplib::DataSink& sink) {
          if (*finished) return false;
          if (*sent < max_tokens) {
            if (disconnect && *chunks == 2) {
              ++disconnects;
              *finished = true;
              return false;  // drop the connection mid-stream
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(o_.token_delay_ms));
            const int64_t n = std::min<int64_t>(o_.tokens_per_chunk, max_tokens - *sent);
            std::string text;
            for (int64_t i = 0; i < n; ++i) text += " tok";
            json chunk = chat ? json{{"object", "chat.completion.chunk"},
                                     {"choices", {{{"index", 0}, {"delta", {{"content", text}}}}}}}
                              : json{{"object", "text_completion"}, {"choices", {{{"index", 0}, {"text", text}}}}};
            std::string ev = "data: " + chunk.dump() + "\n\n";
            sink.write(ev.data(), ev.size());
            *sent += n;
            ++*chunks;
            return true;
          }
          if (usage) {
            ++usage_chunks;
            json u = {{"object", "chat.completion.chunk"},
                      {"choices", json::array()},
                      {"usage", {{"prompt_tokens", prompt_tokens}, {"completion_tokens", *sent},
                                 {"total_tokens", prompt_tokens + *sent}}}};
            std::string ev = "data: " + u.dump() + "\n\n";
            sink.write(ev.data(), ev.size());
          }
          std::string done = "data: [DONE]\n\n";
          sink.write(done.data(), done.size());
          ++completed;
          tokens_completed += *sent;
          prompt_tokens_completed += prompt_tokens;
          *finished = true;
          sink.done();
          return true;
        });
  }

  FakeServerOptions o_;
  httplib::Server srv_;
  int port_ = 0;
  std::thread thread_;
};

BenchConfig config_for(const FakeOpenAIServer& s, int concurrency, int64_t n, int64_t out_len) {
  BenchConfig c;
  EXPECT_EQ(parse_base_url(s.url(), &c.target), "");
  c.concurrency = concurrency;
  c.num_prompts = n;
  c.input_len = 32;
  c.output_len = out_len;
  c.progress = false;
  return c;
}

TEST(BenchAgainstServer, ClosedLoopCountsMatchTheServer) {
  FakeOpenAIServer s({});
  BenchConfig c = config_for(s, 4, 20, 16);
  auto r = run_bench(c);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->model, "fake-model");  // from GET /v1/models
  EXPECT_EQ(r->completed, 20);
  EXPECT_EQ(r->failed, 0);
  EXPECT_EQ(s.requests, 20);
  EXPECT_EQ(r->completion_tokens, s.tokens_completed.load());
  EXPECT_EQ(r->completion_tokens, 20 * 16);
  EXPECT_TRUE(r->tokens_from_usage);
  EXPECT_EQ(r->prompt_tokens, s.prompt_tokens_completed.load());
  EXPECT_EQ(r->chunks, 20 * 16);
  EXPECT_EQ(r->itl_ms.n, 20 * 15);
  EXPECT_EQ(r->ttft_ms.n, 20);
  // Every token waits >= 1 ms on the server, so the gaps and TPOT are at least that.
  // Each request's last 15 chunks each waited >= 1 ms on the server, so however the client
  // thread was scheduled, the mean gap and TPOT are at least that.
  EXPECT_GE(r->itl_ms.mean, 0.9);
  EXPECT_GE(r->tpot_ms.mean, 0.9);
  EXPECT_GT(r->e2e_ms.mean, r->ttft_ms.mean);
  EXPECT_NEAR(r->aggregate_tok_per_s, double(r->completion_tokens) / r->wall_s, 1e-9);
  EXPECT_NEAR(r->per_stream_tok_per_s, r->aggregate_tok_per_s / 4, 1e-9);  // the seed's definition
  EXPECT_NEAR(r->request_per_s, 20 / r->wall_s, 1e-9);
}

TEST(BenchAgainstServer, UsageNotChunksWhenAChunkCarriesSeveralTokens) {
  FakeServerOptions o;
  o.tokens_per_chunk = 3;
  FakeOpenAIServer s(o);
  BenchConfig c = config_for(s, 2, 6, 20);
  c.target.endpoint = BenchEndpoint::kCompletions;
  auto r = run_bench(c);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->completion_tokens, s.tokens_completed.load());
  EXPECT_EQ(r->completion_tokens, 6 * 20);
  EXPECT_EQ(r->chunks, 6 * 7);  // ceil(20 / 3) chunks per request
  EXPECT_TRUE(r->tokens_from_usage);
}

TEST(BenchAgainstServer, CountsChunksAndSaysSoWithoutUsage) {
  FakeServerOptions o;
  o.send_usage = false;
  FakeOpenAIServer s(o);
  auto r = run_bench(config_for(s, 3, 9, 10));
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_FALSE(r->tokens_from_usage);
  EXPECT_EQ(r->completion_tokens, s.tokens_completed.load());
  EXPECT_EQ(r->completion_tokens, r->chunks);
  EXPECT_NE(format_bench_report(*r).find("counted as streamed chunks"), std::string::npos);
}

TEST(BenchAgainstServer, FailuresWithReasons) {
  FakeServerOptions o;
  o.fail_every = 5;
  o.disconnect_every = 7;
  FakeOpenAIServer s(o);
  auto r = run_bench(config_for(s, 3, 30, 8));
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(s.requests, 30);
  EXPECT_EQ(r->failed, s.http500 + s.disconnects);
  EXPECT_EQ(r->completed, s.completed.load());
  EXPECT_EQ(r->completion_tokens, s.tokens_completed.load());
  int64_t n500 = 0, ndrop = 0;
  for (const auto& [why, n] : r->failures) {
    if (why == "HTTP 500: injected failure") n500 += n;
    else if (why == "connection: closed mid-stream" || why == "stream ended without data: [DONE]") ndrop += n;
    else ADD_FAILURE() << "unexpected failure reason: " << why;
  }
  EXPECT_EQ(n500, s.http500.load());
  EXPECT_EQ(ndrop, s.disconnects.load());
  EXPECT_EQ(s.http500, 6);  // requests 5, 10, ..., 30
}

TEST(BenchPrompts, CalibratedByTokenize) {
  FakeServerOptions o;
  o.tokenize_tokens_per_word = 2;  // this "tokenizer" makes two tokens of every word
  FakeOpenAIServer s(o);
  BenchConfig c = config_for(s, 2, 4, 4);
  c.input_len = 64;
  auto r = run_bench(c);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->prompt_tokens, 4 * 64);  // 32 words each, counted by the server as 64 tokens
  EXPECT_NE(r->prompt_note.find("calibrated by /tokenize"), std::string::npos) << r->prompt_note;
}

TEST(BenchPoisson, ArrivalsArePoissonAndSeeded) {
  const double rate = 20;
  auto a = poisson_arrivals(4000, rate, 7);
  ASSERT_EQ(a.size(), 4000u);
  EXPECT_EQ(a[0], 0.0);
  const double mean_gap = a.back() / double(a.size() - 1);
  EXPECT_NEAR(mean_gap, 1 / rate, 0.05 / rate);  // 4000 exponential gaps: ~1.6 % std error
  // Exponential gaps: the share below the mean is 1 - 1/e.
  int below = 0;
  for (size_t i = 1; i < a.size(); ++i) below += (a[i] - a[i - 1]) < 1 / rate;
  EXPECT_NEAR(double(below) / 3999, 1 - std::exp(-1.0), 0.03);
  EXPECT_EQ(poisson_arrivals(50, rate, 7), poisson_arrivals(50, rate, 7));
  EXPECT_NE(poisson_arrivals(50, rate, 7), poisson_arrivals(50, rate, 8));
}

TEST(BenchPoisson, RequestsLeaveNoEarlierThanTheirArrival) {
  FakeOpenAIServer s({});
  BenchConfig c = config_for(s, 8, 12, 4);
  c.request_rate = 40;
  c.seed = 3;
  auto r = run_bench(c);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  auto arrivals = poisson_arrivals(12, 40, 3);
  for (const auto& q : r->requests) EXPECT_GE(q.start_s + 1e-4, arrivals[size_t(q.index)]);
  EXPECT_GE(r->wall_s, arrivals.back());
  EXPECT_EQ(r->completed, 12);
}

TEST(BenchStats, PercentilesAsNumpy) {
  std::vector<double> v;
  for (int i = 1; i <= 100; ++i) v.push_back(i);
  Distribution d = summarize(v);
  // numpy.percentile(np.arange(1, 101), [50, 90, 99]) = [50.5, 90.1, 99.01]
  EXPECT_DOUBLE_EQ(d.median, 50.5);
  EXPECT_NEAR(d.p90, 90.1, 1e-9);
  EXPECT_NEAR(d.p99, 99.01, 1e-9);
  EXPECT_DOUBLE_EQ(d.mean, 50.5);
}

TEST(BenchSse, EventsSplitAcrossReads) {
  SseParser p;
  std::vector<std::string> got;
  auto on = [&](const std::string& e) { got.push_back(e); };
  const std::string stream = "data: {\"a\":1}\r\n\r\n: comment\n\ndata: {\"b\":2}\n\ndata: [DONE]\n\n";
  for (char ch : stream) p.feed(&ch, 1, on);
  EXPECT_EQ(got, (std::vector<std::string>{"{\"a\":1}", "{\"b\":2}", "[DONE]"}));
}

TEST(BenchDataset, LinesAndErrors) {
  const fs::path f = fs::temp_directory_path() / ("moonrun_bench_ds_" + std::to_string(::getpid()) + ".jsonl");
  {
    std::ofstream(f) << R"({"prompt": "hello there", "max_tokens": 5})" "\n\n"
                     << R"({"messages": [{"role": "user", "content": "hi"}]})" "\n";
  }
  BenchConfig c;
  c.dataset = f.string();
  c.num_prompts = 3;
  c.output_len = 9;
  std::string note;
  auto p = make_bench_prompts(c, &note);
  ASSERT_TRUE(p.is_ok()) << p.status().to_string();
  ASSERT_EQ(p->size(), 3u);
  EXPECT_EQ((*p)[0].max_tokens, 5);
  EXPECT_EQ((*p)[1].max_tokens, 9);
  EXPECT_TRUE((*p)[1].messages.is_array());
  EXPECT_EQ((*p)[2].text, "hello there");  // cycled
  { std::ofstream(f) << R"({"prompt": "ok"})" "\n" << R"({"text": 3})" "\n"; }
  auto bad = make_bench_prompts(c, &note);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().message(), f.string() + ":2: needs \"prompt\" (string) or \"messages\" (array)");
  fs::remove(f);
}

// The command line against the same server: the report, --json-out and --plot.
TEST(BenchCli, JsonOutAndPlot) {
  FakeServerOptions o;
  o.fail_every = 4;
  o.token_delay_ms = 3;
  FakeOpenAIServer s(o);
  const fs::path dir = fs::temp_directory_path() / ("moonrun_bench_cli_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string cmd = std::string(MOONRUN_EXE) + " bench --base-url " + s.url() +
                          "/v1 --concurrency 3 --num-prompts 12 --input-len 16 --output-len 24 --no-progress" +
                          " --json-out " + (dir / "r.json").string() + " --plot " + (dir / "r.png").string() +
                          " > " + (dir / "out.txt").string() + " 2>&1";
  int status = std::system(cmd.c_str());
  std::ifstream out_file(dir / "out.txt");
  std::string out((std::istreambuf_iterator<char>(out_file)), {});
  ASSERT_EQ(WEXITSTATUS(status), 0) << out;
  EXPECT_NE(out.find("9 completed, 3 failed"), std::string::npos) << out;
  EXPECT_NE(out.find("3 x HTTP 500: injected failure"), std::string::npos) << out;

  std::ifstream jf(dir / "r.json");
  json j = json::parse(jf);
  EXPECT_EQ(j["total_completion_tokens"].get<int64_t>(), s.tokens_completed.load());
  EXPECT_EQ(j["completed"].get<int64_t>(), 9);
  EXPECT_EQ(j["requests"].size(), 12u);
  for (const char* key : {"wall_s", "aggregate_tok_per_s", "per_stream_tok_per_s", "ttft_ms", "itl_ms", "tpot_ms",
                          "e2e_latency_ms", "request_throughput_per_s"})
    EXPECT_TRUE(j.contains(key)) << key;

  int w = 0, h = 0, comp = 0;
  unsigned char* img = stbi_load((dir / "r.png").c_str(), &w, &h, &comp, 3);
  ASSERT_NE(img, nullptr) << "the PNG does not decode";
  EXPECT_EQ(w, 1600);
  EXPECT_EQ(h, 1100);
  int64_t inked = 0;
  for (int i = 0; i < w * h * 3; ++i) inked += img[i] < 128;
  EXPECT_GT(inked, 10000);  // axes, text, bars: far from a blank page
  stbi_image_free(img);

  // Bad input: one line, exit 2.
  status = std::system((std::string(MOONRUN_EXE) + " bench --base-url https://x --num-prompts 1 > " +
                        (dir / "err.txt").string() + " 2>&1").c_str());
  EXPECT_EQ(WEXITSTATUS(status), 2);
  if (!std::getenv("MOONRUN_KEEP_TEST_OUTPUT")) fs::remove_all(dir);
}

}  // namespace
}  // namespace moonrun::tools
