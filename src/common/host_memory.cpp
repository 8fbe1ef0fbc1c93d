#include "common/host_memory.h"

#include <fstream>
#include <string>

namespace moonrun {

namespace {

// The "Key:   123 kB" line of a /proc file (other lines hold words, not numbers).
int64_t read_kb(const char* path, const std::string& key) {
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);)
    if (line.compare(0, key.size(), key) == 0) return std::stoll(line.substr(key.size())) * 1024;
  return 0;
}

}  // namespace

HostMemory host_memory() {
  HostMemory m;
  m.rss_bytes = read_kb("/proc/self/status", "VmRSS:");
  m.peak_rss_bytes = read_kb("/proc/self/status", "VmHWM:");
  m.available_bytes = read_kb("/proc/meminfo", "MemAvailable:");
  return m;
}

}  // namespace moonrun
