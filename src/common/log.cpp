#include "common/log.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>

namespace moonrun {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::INFO)};
thread_local std::string t_tag;
std::mutex g_mu;
}  // namespace

void set_log_level(LogLevel level) { g_level = static_cast<int>(level); }
LogLevel log_level() { return static_cast<LogLevel>(g_level.load()); }
void set_thread_log_tag(std::string tag) { t_tag = std::move(tag); }

LogLine::LogLine(LogLevel level, const char*, int)
    : enabled_(static_cast<int>(level) >= g_level.load()), level_(level) {}

LogLine::~LogLine() {
  if (!enabled_) return;
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  localtime_r(&t, &tm);
  char ts[32];
  std::strftime(ts, sizeof ts, "%Y-%m-%d %H:%M:%S", &tm);
  const char* lvl = level_ == LogLevel::WARNING ? "WARNING: "
                    : level_ == LogLevel::ERROR ? "ERROR: "
                    : level_ == LogLevel::DEBUG ? "DEBUG: "
                                                : "";
  std::string msg = stream_.str();
  std::lock_guard<std::mutex> lock(g_mu);
  if (t_tag.empty())
    std::fprintf(stderr, "[%s] %s%s\n", ts, lvl, msg.c_str());
  else
    std::fprintf(stderr, "[%s %s] %s%s\n", ts, t_tag.c_str(), lvl, msg.c_str());
  std::fflush(stderr);
}

}  // namespace moonrun
