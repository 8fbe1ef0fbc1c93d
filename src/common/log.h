#pragma once
// Logging in the shape the seeds' users read: "[2026-07-28 07:39:14 TP0 EP0] message".
// MR_LOG(INFO) << "Load weight begin. avail mem=" << gb << " GB";
// Output goes to stderr (stdout stays clean for JSON-printing commands).
//
// Every record is exactly one line, whatever the message holds: control characters (a
// newline in a client's reasoning_effort, an ANSI escape, U+2028) are written escaped
// (\n, \x1b, \u2028), so nothing a client sends can forge a log line. With
// set_log_format(kJson) each record is one JSON object per line (time, level, tag, msg and
// any structured fields), for log shippers.
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace moonrun {

// TRACE: per-connection HTTP events; DEBUG: per-request detail and engine steps;
// INFO: lifecycle and one line per request; WARNING/ERROR: as named; CRITICAL: the process
// cannot go on.
enum class LogLevel { TRACE = 0, DEBUG = 1, INFO = 2, WARNING = 3, ERROR = 4, CRITICAL = 5 };
enum class LogFormat { kText, kJson };

void set_log_level(LogLevel level);
LogLevel log_level();
bool log_enabled(LogLevel level);
// "trace" | "debug" | "info" | "warning" (or "warn") | "error" | "critical"; false if unknown.
bool parse_log_level(std::string_view name, LogLevel& level);
const char* log_level_name(LogLevel level);
void set_log_format(LogFormat format);
LogFormat log_format();
// Per-thread tag printed after the timestamp, e.g. "TP0 EP0" for a rank's worker thread.
void set_thread_log_tag(std::string tag);

// text with every control character escaped (\n \r \t \xNN, and \u2028 / \u2029 / \u0085):
// safe to put on one log line.
std::string escape_log_text(std::string_view text);

// One structured record: message plus key=value fields (text) or JSON keys (json).
// Values are strings or numbers; strings are escaped like the message.
struct LogField {
  std::string key;
  std::string value;
  bool quoted = false;  // a string value (quoted in text when it has spaces; a JSON string)
};
void log_record(LogLevel level, std::string_view message, const std::vector<LogField>& fields = {});

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
