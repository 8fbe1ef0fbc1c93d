#include "common/log.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>

#include <nlohmann/json.hpp>

namespace moonrun {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::INFO)};
std::atomic<int> g_format{static_cast<int>(LogFormat::kText)};
thread_local std::string t_tag;
std::mutex g_mu;

std::string timestamp(bool iso) {
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  localtime_r(&t, &tm);
  char ts[48];
  std::strftime(ts, sizeof ts, iso ? "%Y-%m-%dT%H:%M:%S" : "%Y-%m-%d %H:%M:%S", &tm);
  if (!iso) return ts;
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  char out[64];
  std::snprintf(out, sizeof out, "%s.%03lld", ts, static_cast<long long>(ms));
  return out;
}

void write_line(const std::string& line) {
  std::lock_guard<std::mutex> lock(g_mu);
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

bool needs_quotes(const std::string& v) {
  if (v.empty()) return true;
  for (char c : v)
    if (c == ' ' || c == '"' || c == '=') return true;
  return false;
}

}  // namespace

void set_log_level(LogLevel level) { g_level = static_cast<int>(level); }
LogLevel log_level() { return static_cast<LogLevel>(g_level.load()); }
bool log_enabled(LogLevel level) { return static_cast<int>(level) >= g_level.load(); }
void set_log_format(LogFormat format) { g_format = static_cast<int>(format); }
LogFormat log_format() { return static_cast<LogFormat>(g_format.load()); }
void set_thread_log_tag(std::string tag) { t_tag = std::move(tag); }

bool parse_log_level(std::string_view name, LogLevel& level) {
  static const std::pair<const char*, LogLevel> names[] = {
      {"trace", LogLevel::TRACE},     {"debug", LogLevel::DEBUG}, {"info", LogLevel::INFO},
      {"warning", LogLevel::WARNING}, {"warn", LogLevel::WARNING}, {"error", LogLevel::ERROR},
      {"critical", LogLevel::CRITICAL}};
  std::string lower(name);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const auto& [n, l] : names)
    if (lower == n) {
      level = l;
      return true;
    }
  return false;
}

const char* log_level_name(LogLevel level) {
  switch (level) {
    case LogLevel::TRACE: return "trace";
    case LogLevel::DEBUG: return "debug";
    case LogLevel::INFO: return "info";
    case LogLevel::WARNING: return "warning";
    case LogLevel::ERROR: return "error";
    case LogLevel::CRITICAL: return "critical";
  }
  return "info";
}

std::string escape_log_text(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else if (c == 0xc2 && i + 1 < text.size() && static_cast<unsigned char>(text[i + 1]) == 0x85) {
      out += "\\u0085";  // NEL: a line break to some log viewers
      ++i;
    } else if (c == 0xe2 && i + 2 < text.size() && static_cast<unsigned char>(text[i + 1]) == 0x80 &&
               (static_cast<unsigned char>(text[i + 2]) == 0xa8 || static_cast<unsigned char>(text[i + 2]) == 0xa9)) {
      out += static_cast<unsigned char>(text[i + 2]) == 0xa8 ? "\\u2028" : "\\u2029";
      i += 2;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

void log_record(LogLevel level, std::string_view message, const std::vector<LogField>& fields) {
  if (!log_enabled(level)) return;
  if (log_format() == LogFormat::kJson) {
    nlohmann::json j;
    j["time"] = timestamp(true);
    j["level"] = log_level_name(level);
    if (!t_tag.empty()) j["tag"] = t_tag;
    j["msg"] = std::string(message);
    for (const auto& f : fields) {
      if (f.quoted) {
        j[f.key] = f.value;
      } else {
        // Numbers stay numbers for the log shipper; anything else is kept as text.
        nlohmann::json v = nlohmann::json::parse(f.value, nullptr, false);
        j[f.key] = v.is_discarded() || v.is_structured() ? nlohmann::json(f.value) : v;
      }
    }
    // dump() escapes every control character (and U+2028 is harmless inside a JSON string
    // on one line); invalid UTF-8 is replaced, never thrown on.
    write_line(j.dump(-1, ' ', true, nlohmann::json::error_handler_t::replace) + "\n");
    return;
  }
  const char* lvl = level == LogLevel::WARNING ? "WARNING: "
                    : level == LogLevel::ERROR ? "ERROR: "
                    : level == LogLevel::CRITICAL ? "CRITICAL: "
                    : level == LogLevel::DEBUG ? "DEBUG: "
                    : level == LogLevel::TRACE ? "TRACE: "
                                               : "";
  std::string line = "[" + timestamp(false);
  if (!t_tag.empty()) line += " " + escape_log_text(t_tag);
  line += "] ";
  line += lvl;
  line += escape_log_text(message);
  for (const auto& f : fields) {
    std::string v = escape_log_text(f.value);
    if (f.quoted && needs_quotes(v)) {
      std::string q = "\"";
      for (char c : v) q += c == '"' ? std::string("\\\"") : std::string(1, c);
      v = q + "\"";
    }
    line += " " + f.key + "=" + v;
  }
  line += "\n";
  write_line(line);
}

LogLine::LogLine(LogLevel level, const char*, int) : enabled_(log_enabled(level)), level_(level) {}

LogLine::~LogLine() {
  if (!enabled_) return;
  log_record(level_, stream_.str());
}

}  // namespace moonrun
