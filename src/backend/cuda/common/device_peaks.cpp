#include "backend/cuda/common/device_peaks.h"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/gemm/blas.h"

namespace moonrun::cuda {

namespace {

// Best of `reps` timings of fn on stream (ms): the steady state, not the first touch.
template <class Fn>
float best_ms(cudaStream_t stream, int reps, Fn&& fn) {
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  fn();  // warm-up: plans, page mapping
  float best = 1e30f;
  for (int i = 0; i < reps; ++i) {
    CUDA_CHECK(cudaEventRecord(a, stream));
    fn();
    CUDA_CHECK(cudaEventRecord(b, stream));
    CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    best = std::min(best, ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return best;
}

}  // namespace

DevicePeaks measure_device_peaks(int device) {
  CUDA_CHECK(cudaSetDevice(device));
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  DevicePeaks p;
  {
    constexpr size_t kBytes = size_t{1} << 30;
    void *src = nullptr, *dst = nullptr;
    CUDA_CHECK(cudaMalloc(&src, kBytes / 2));
    CUDA_CHECK(cudaMalloc(&dst, kBytes / 2));
    CUDA_CHECK(cudaMemsetAsync(src, 1, kBytes / 2, stream));
    const float ms = best_ms(stream, 10, [&] { CUDA_CHECK(cudaMemcpyAsync(dst, src, kBytes / 2, cudaMemcpyDeviceToDevice, stream)); });
    p.copy_gb_s = static_cast<double>(kBytes) / (ms * 1e-3) / 1e9;
    cudaFree(src);
    cudaFree(dst);
  }
  {
    constexpr int n = 8192;
    const size_t elems = size_t{n} * n;
    bf16 *x = nullptr, *w = nullptr, *y = nullptr;
    CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&x), elems * sizeof(bf16)));
    CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&w), elems * sizeof(bf16)));
    CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&y), elems * sizeof(bf16)));
    // Small values: no infinities to slow anything down or trip a check.
    CUDA_CHECK(cudaMemsetAsync(x, 0x3c, elems * sizeof(bf16), stream));
    CUDA_CHECK(cudaMemsetAsync(w, 0x3c, elems * sizeof(bf16), stream));
    {
      Blas blas(stream);
      const DeviceLinear lin{w, n, n};
      const float ms = best_ms(stream, 5, [&] { blas.linear(x, n, lin, y); });
      p.bf16_tflops = 2.0 * n * n * static_cast<double>(n) / (ms * 1e-3) / 1e12;
    }
    cudaFree(x);
    cudaFree(w);
    cudaFree(y);
  }
  cudaStreamDestroy(stream);
  return p;
}

}  // namespace moonrun::cuda
