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

// Whether this process's wgmma kernels (common/wgmma.cuh) run on `device` as sm_90a machine
// code: false on other GPUs, or where the driver chose the plain sm_90 image the build also
// carries (a probe kernel says which ran). Cached per device; call it outside graph capture.
bool wgmma_available(int device);

}  // namespace moonrun::cuda
