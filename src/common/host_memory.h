#pragma once
// This process's host memory, from /proc: what the load log prints and the GPU check
// measures (a load must not hold the checkpoint in host memory).
#include <cstdint>

namespace moonrun {

struct HostMemory {
  int64_t rss_bytes = 0;        // VmRSS: resident now
  int64_t peak_rss_bytes = 0;   // VmHWM: the high-water mark
  int64_t available_bytes = 0;  // MemAvailable of the machine
};
HostMemory host_memory();

}  // namespace moonrun
