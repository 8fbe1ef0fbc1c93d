#include "backend/cuda/common/device_buffer.h"

#include <algorithm>

namespace moonrun::cuda {

namespace {
constexpr size_t kAlign = 256;
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
}  // namespace

DeviceArena::DeviceArena(size_t bytes) : capacity_(bytes / kAlign * kAlign) {
  if (capacity_ > 0) CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&base_), capacity_));
}

DeviceArena::DeviceArena(void* base, size_t bytes)
    : base_(static_cast<char*>(base)), owned_(false), capacity_(bytes / kAlign * kAlign) {}

DeviceArena::~DeviceArena() {
  if (base_ && owned_) cudaFree(base_);
}

void* DeviceArena::alloc_bytes(size_t bytes, const char* what) {
  const size_t start = align_up(used_);
  if (start + bytes + scratch_used_ > capacity_)
    throw CudaError(std::string("device arena full: ") + what + " needs " + std::to_string(bytes) + " bytes, " +
                    std::to_string(capacity_ - std::min(capacity_, start + scratch_used_)) + " of " +
                    std::to_string(capacity_) + " left (raise --mem-fraction-static or use a smaller model)");
  used_ = start + bytes;
  return base_ + start;
}

void* DeviceArena::take_scratch(size_t bytes) {
  const size_t need = align_up(std::max<size_t>(bytes, 1));
  if (used_ + scratch_used_ + need > capacity_)
    throw CudaError("device arena full: a step's temporaries need " + std::to_string(need) + " more bytes, " +
                    std::to_string(capacity_ - used_ - scratch_used_) +
                    " left after the weights and cache pools (lower --chunked-prefill-size or "
                    "--mem-fraction-static's share for the KV cache)");
  scratch_used_ += need;
  return base_ + capacity_ - scratch_used_;
}

}  // namespace moonrun::cuda
