// The CUDA side of `moonrun` starts here: device discovery, checked with file:line.
#include <cuda_runtime.h>

#include "kernels/cuda/common/device_info.h"

namespace moonrun::cuda {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver / no device: the CPU backend serves
    return 0;
  }
  return n;
}

}  // namespace moonrun::cuda
