// The CUDA side of `moonrun` starts here: device discovery. Failures here mean "no usable
// GPU" and are answered with the CPU backend or a clear message, never an abort.
#include <cuda_runtime.h>

#include "backend/cuda/common/device_info.h"

namespace moonrun::cuda {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver / no device: the CPU backend serves
    return 0;
  }
  return n;
}

DeviceMemory device_memory(int device) {
  DeviceMemory m;
  cudaDeviceProp prop{};
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess || cudaSetDevice(device) != cudaSuccess ||
      cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
    (void)cudaGetLastError();
    return m;
  }
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  m.name = prop.name;
  m.free_gb = free_bytes / kGiB;
  m.total_gb = total_bytes / kGiB;
  return m;
}

}  // namespace moonrun::cuda
