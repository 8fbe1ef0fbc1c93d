// The CUDA side of `moonrun` starts here: device discovery. Failures here mean "no usable
// GPU" and are answered with the CPU backend or a clear message, never an abort.
#include <cuda_runtime.h>

#include <map>
#include <mutex>

#include "backend/cuda/common/cuda_check.h"
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

namespace {
__global__ void wgmma_probe_kernel(int* out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  *out = 1;
#else
  *out = 0;
#endif
}
}  // namespace

bool wgmma_available(int device) {
  static std::mutex mu;
  static std::map<int, bool> known;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = known.find(device); it != known.end()) return it->second;
  int prev = 0;
  CUDA_CHECK(cudaGetDevice(&prev));
  CUDA_CHECK(cudaSetDevice(device));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  bool ok = false;
  if (prop.major == 9 && prop.minor == 0) {
    int* flag = nullptr;
    int host = 0;
    CUDA_CHECK(cudaMalloc(&flag, sizeof(int)));
    wgmma_probe_kernel<<<1, 1>>>(flag);
    CUDA_CHECK_LAUNCH();
    CUDA_CHECK(cudaMemcpy(&host, flag, sizeof(int), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaFree(flag));
    ok = host == 1;
  }
  CUDA_CHECK(cudaSetDevice(prev));
  known[device] = ok;
  return ok;
}

}  // namespace moonrun::cuda
