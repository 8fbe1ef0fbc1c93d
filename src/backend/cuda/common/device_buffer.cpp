#include "backend/cuda/common/device_buffer.h"

namespace moonrun::cuda {

DeviceArena::DeviceArena(size_t bytes) : capacity_(bytes) {
  if (bytes > 0) CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&base_), bytes));
}

DeviceArena::~DeviceArena() {
  if (base_) cudaFree(base_);
}

void* DeviceArena::alloc_bytes(size_t bytes, const char* what) {
  constexpr size_t kAlign = 256;
  const size_t start = (used_ + kAlign - 1) / kAlign * kAlign;
  if (start + bytes > capacity_)
    throw CudaError(std::string("device arena full: ") + what + " needs " + std::to_string(bytes) +
                    " bytes, " + std::to_string(capacity_ - std::min(start, capacity_)) + " of " +
                    std::to_string(capacity_) + " left (raise --mem-fraction-static or use a smaller model)");
  used_ = start + bytes;
  return base_ + start;
}

}  // namespace moonrun::cuda
