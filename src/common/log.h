#pragma once
// Logging in the shape the seeds' users read: "[2026-07-28 07:39:14 TP0 EP0] message".
// MR_LOG(INFO) << "Load weight begin. avail mem=" << gb << " GB";
// Output goes to stderr (stdout stays clean for JSON-printing commands).
#include <sstream>
#include <string>

namespace moonrun {

enum class LogLevel { DEBUG = 0, INFO = 1, WARNING = 2, ERROR = 3 };

void set_log_level(LogLevel level);
LogLevel log_level();
// Per-thread tag printed after the timestamp, e.g. "TP0 EP0" for a rank's worker thread.
void set_thread_log_tag(std::string tag);

class LogLine {
 public:
  LogLine(LogLevel level, const char* file, int line);
  ~LogLine();
  template <typename T>
  LogLine& operator<<(const T& v) {
    if (enabled_) stream_ << v;
    return *this;
  }

 private:
  bool enabled_;
  LogLevel level_;
  std::ostringstream stream_;
};

}  // namespace moonrun

#define MR_LOG(level) ::moonrun::LogLine(::moonrun::LogLevel::level, __FILE__, __LINE__)
