#include "common/host_memory.h"

#include <fstream>
#include <string>

namespace moonrun {

namespace {

// "Key:   123 kB" lines of a /proc file.
int64_t read_kb(const char* path, const std::string& key) {
  std::ifstream in(path);
  std::string k, unit;
  long long kb = 0;
  while (in >> k >> kb) {
    std::getline(in, unit);
    if (k == key) return static_cast<int64_t>(kb) * 1024;
  }
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
