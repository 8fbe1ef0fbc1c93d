#include "backend/cuda/standin_comm.h"

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/common/cuda_check.h"
#include "common/check.h"

namespace moonrun::cuda {
namespace {

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// One warp, `ns` nanoseconds of the device's clock: a small collective's latency, during
// which (like NCCL's kernel) it holds one multiprocessor and the rest of the step waits.
__global__ void spin_kernel(uint64_t ns) {
  const uint64_t t0 = global_ns();
  while (global_ns() - t0 < ns) {
  }
}

class CudaStandinComm final : public Communicator {
 public:
  CudaStandinComm(int size, double latency_us)
      : size_(size), ns_(latency_us > 0 ? static_cast<uint64_t>(latency_us * 1e3) : 0) {}
  int rank() const override { return 0; }
  int size() const override { return size_; }
  void bind_stream(void* stream) override { stream_ = static_cast<cudaStream_t>(stream); }
  void all_reduce_sum(float* data, size_t n) override { wait(); }
  void all_gather(const float* in, size_t n, float* out) override {
    wait();
    for (int r = 0; r < size_; ++r) {
      float* dst = out + static_cast<size_t>(r) * n;
      if (dst != in) CUDA_CHECK(cudaMemcpyAsync(dst, in, n * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
    }
  }
  void abort(const std::string&) override {}

 private:
  void wait() {
    if (ns_ == 0) return;
    spin_kernel<<<1, 32, 0, stream_>>>(ns_);
    CUDA_CHECK_LAUNCH();
  }
  int size_;
  uint64_t ns_;
  cudaStream_t stream_ = nullptr;
};

}  // namespace

std::unique_ptr<Communicator> make_standin_comm(int size, double latency_us) {
  MR_CHECK_LE(1, size) << "a stand-in group's size";
  return std::make_unique<CudaStandinComm>(size, latency_us);
}

}  // namespace moonrun::cuda
