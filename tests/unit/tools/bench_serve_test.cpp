// `moonrun bench` against `moonrun serve` (the embedded demo model on the CPU): bench's
// request and token counts must agree with the server's own Prometheus counters. Skips
// while `moonrun serve` cannot start (before it lands, or without its demo model).
#include <httplib.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "tools/bench.h"

namespace moonrun::tools {
namespace {

namespace fs = std::filesystem;

// A port nothing listens on: bind port 0, read what the kernel chose, close.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

// The sum of every sample of `metric` (all label sets) in a Prometheus text page; -1 if absent.
double prometheus_sum(const std::string& page, const std::string& metric) {
  const std::regex line("^" + metric + R"((\{[^}]*\})? ([0-9.eE+-]+)$)");  // names: [a-z_:]
  double sum = -1;
  size_t start = 0;
  while (start < page.size()) {
    size_t end = page.find('\n', start);
    if (end == std::string::npos) end = page.size();
    std::smatch m;
    const std::string l = page.substr(start, end - start);
    if (std::regex_match(l, m, line)) sum = (sum < 0 ? 0 : sum) + std::stod(m[2].str());
    start = end + 1;
  }
  return sum;
}

class ServeProcess {
 public:
  explicit ServeProcess(int port) : port_(port) {
    log_ = (fs::temp_directory_path() / ("moonrun_bench_serve_" + std::to_string(::getpid()) + ".log")).string();
    // Everything the child needs is prepared before fork: after it, only exec-safe calls.
    const std::string p = std::to_string(port);
    const std::string demo = (fs::path(MOONRUN_BINARY_DIR) / "demo-model").string();
    const bool have_demo = fs::exists(fs::path(demo) / "config.json");
    const int fd = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      if (have_demo)
        ::execl(MOONRUN_EXE, MOONRUN_EXE, "serve", "--host", "127.0.0.1", "--port", p.c_str(), "--model-path",
                demo.c_str(), nullptr);
      else
        ::execl(MOONRUN_EXE, MOONRUN_EXE, "serve", "--host", "127.0.0.1", "--port", p.c_str(), nullptr);
      ::_exit(127);
    }
    ::close(fd);
  }
  ~ServeProcess() {
    if (pid_ > 0 && !exited_) {
      ::kill(pid_, SIGTERM);
      for (int i = 0; i < 100 && ::waitpid(pid_, nullptr, WNOHANG) == 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    std::error_code ec;
    fs::remove(log_, ec);
  }
  // Waits for GET /health; false when the process exits first or time runs out.
  bool wait_ready(double seconds, std::string* why) {
    httplib::Client c("127.0.0.1", port_);
    c.set_connection_timeout(1, 0);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < deadline) {
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
        exited_ = true;
        *why = "moonrun serve exited before it answered /health";
        return false;
      }
      if (auto r = c.Get("/health"); r && r->status == 200) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    *why = "moonrun serve did not answer /health within " + std::to_string(int(seconds)) + " s";
    return false;
  }

 private:
  int port_;
  pid_t pid_ = -1;
  bool exited_ = false;
  std::string log_;
};

TEST(BenchAgainstMoonrunServe, CountsMatchTheServersMetrics) {
  const int port = free_port();
  ServeProcess serve(port);
  std::string why;
  ASSERT_TRUE(serve.wait_ready(60, &why)) << "moonrun serve did not start: " << why;

  BenchConfig c;
  ASSERT_EQ(parse_base_url("http://127.0.0.1:" + std::to_string(port), &c.target), "");
  c.concurrency = 2;
  c.num_prompts = 6;
  c.input_len = 8;
  c.output_len = 8;
  c.ignore_eos = true;
  c.progress = false;
  auto r = run_bench(c);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->failed, 0) << format_bench_report(*r);
  EXPECT_EQ(r->completed, 6);

  httplib::Client http("127.0.0.1", port);
  auto m = http.Get("/metrics");
  ASSERT_TRUE(m && m->status == 200);
  const double generated = prometheus_sum(m->body, "vllm:generation_tokens_total");
  const double finished = prometheus_sum(m->body, "vllm:request_success_total");
  ASSERT_GE(generated, 0) << "/metrics lacks vllm:generation_tokens_total";
  ASSERT_GE(finished, 0) << "/metrics lacks vllm:request_success_total";
  EXPECT_EQ(double(r->completion_tokens), generated);
  EXPECT_EQ(double(r->completed), finished);
  EXPECT_TRUE(r->tokens_from_usage);
  const double prompt = prometheus_sum(m->body, "vllm:prompt_tokens_total");
  if (prompt >= 0) EXPECT_EQ(double(r->prompt_tokens), prompt);
}

}  // namespace
}  // namespace moonrun::tools
