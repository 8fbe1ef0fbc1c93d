#pragma once
// Device memory, two ways:
// - DeviceBuffer<T>: one cudaMalloc, owned (tests, small long-lived buffers).
// - DeviceArena: one big cudaMalloc of --mem-fraction-static x the card, carved from both
//   ends: long-lived allocations (weights, cache pools) from the bottom, per-step scratch
//   from the top with mark/rewind. A model that does not fit fails at load with the numbers,
//   not mid-request; and the same sequence of scratch requests gets the same addresses
//   every step, which a captured CUDA graph relies on. Every kernel runs on one stream in
//   order, so rewinding after a layer is safe without a sync.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/cuda/common/cuda_check.h"

namespace moonrun::cuda {

template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) : n_(n) {
    if (n > 0) CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(T)));
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  ~DeviceBuffer() {
    if (p_) cudaFree(p_);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* data() { return p_; }
  const T* data() const { return p_; }
  size_t size() const { return n_; }
  void upload(const std::vector<T>& host) {
    if (host.size() != n_)
      throw CudaError("DeviceBuffer::upload: " + std::to_string(host.size()) + " elements into a buffer of " +
                      std::to_string(n_));
    CUDA_CHECK(cudaMemcpy(p_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    if (n_) CUDA_CHECK(cudaMemcpy(host.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  void zero() {
    if (n_) CUDA_CHECK(cudaMemset(p_, 0, n_ * sizeof(T)));
  }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

class DeviceArena {
 public:
  // Reserves `bytes` of device memory at once.
  explicit DeviceArena(size_t bytes);
  // A view of `bytes` at `base`, memory another arena owns (a backend lane's scratch,
  // Ops::make_lane): not freed here.
  DeviceArena(void* base, size_t bytes);
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  // Long-lived, 256-byte aligned; throws CudaError naming `what` and what is left when full.
  void* alloc_bytes(size_t bytes, const char* what);
  // Scratch from the top: take, mark, rewind.
  void* take_scratch(size_t bytes);
  size_t scratch_mark() const { return scratch_used_; }
  void rewind_scratch(size_t mark) { scratch_used_ = mark; }

  size_t capacity() const { return capacity_; }
  size_t used() const { return used_; }  // long-lived bytes
  size_t available() const { return capacity_ - used_ - scratch_used_; }

 private:
  char* base_ = nullptr;
  bool owned_ = true;
  size_t capacity_ = 0;
  size_t used_ = 0;
  size_t scratch_used_ = 0;
};

}  // namespace moonrun::cuda
