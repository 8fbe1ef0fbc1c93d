#pragma once
#include <string>

namespace moonrun::cuda {

// Number of CUDA devices visible to this process; 0 when there is no driver or no GPU.
int device_count();

// Name and memory of one device, for the startup log; empty name when it cannot be read.
struct DeviceMemory {
  std::string name;
  double free_gb = 0;   // GiB
  double total_gb = 0;  // GiB
};
DeviceMemory device_memory(int device);

}  // namespace moonrun::cuda
