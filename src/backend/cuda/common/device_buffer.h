#pragma once
// Device memory, three ways:
// - DeviceBuffer<T>: one cudaMalloc, owned (tests, small long-lived buffers).
// - DeviceArena: one big cudaMalloc carved by a bump pointer; the model's weights, caches
//   and scratch come from it, sized once from --mem-fraction-static, so a model that does
//   not fit fails at load with the numbers instead of mid-request.
// - Scratch: a mark/rewind view of an arena region for per-layer temporaries. Every kernel
//   runs on one stream in order, so rewinding after a layer is safe without a sync.
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
    MR_CUDA_SIZE_CHECK(host.size());
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
  void MR_CUDA_SIZE_CHECK(size_t n) const {
    if (n != n_) throw CudaError("DeviceBuffer::upload: " + std::to_string(n) + " elements into a buffer of " +
                                 std::to_string(n_));
  }
  T* p_ = nullptr;
  size_t n_ = 0;
};

class DeviceArena {
 public:
  // Reserves `bytes` of device memory at once.
  explicit DeviceArena(size_t bytes);
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  // 256-byte aligned; throws CudaError naming the request and what is left when full.
  void* alloc_bytes(size_t bytes, const char* what = "");
  template <typename T>
  T* alloc(size_t n, const char* what = "") {
    return static_cast<T*>(alloc_bytes(n * sizeof(T), what));
  }
  // Uploads host data into a fresh allocation (synchronous: loading is not on a hot path).
  template <typename T>
  T* upload(const std::vector<T>& host, const char* what = "") {
    T* p = alloc<T>(host.size(), what);
    if (!host.empty()) CUDA_CHECK(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
    return p;
  }

  size_t capacity() const { return capacity_; }
  size_t used() const { return used_; }
  size_t available() const { return capacity_ - used_; }
  // Rewinding: everything allocated after mark() is released by rewind(mark).
  size_t mark() const { return used_; }
  void rewind(size_t mark) { used_ = mark; }

 private:
  char* base_ = nullptr;
  size_t capacity_ = 0;
  size_t used_ = 0;
};

// Per-call temporaries: Scratch s(arena); float* t = s.take<float>(n); freed when s dies.
class Scratch {
 public:
  explicit Scratch(DeviceArena& arena) : arena_(arena), mark_(arena.mark()) {}
  ~Scratch() { arena_.rewind(mark_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <typename T>
  T* take(size_t n) {
    return arena_.alloc<T>(n, "scratch");
  }
  DeviceArena& arena() { return arena_; }

 private:
  DeviceArena& arena_;
  size_t mark_;
};

}  // namespace moonrun::cuda
