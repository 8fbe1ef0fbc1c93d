#pragma once
// What one GPU can do at best, measured (not taken from a data sheet): the device-to-device
// copy bandwidth, which is the floor a memory-bound decode step is held to, and the bf16
// tensor-core GEMM rate, which prefill is held to. `moonrun bench-model` measures both in
// the same run as the model so its ratios compare like with like.

namespace moonrun::cuda {

struct DevicePeaks {
  double copy_gb_s = 0;      // (read + written bytes) / time of a 1 GiB cudaMemcpy D2D
  double bf16_tflops = 0;    // an 8192 x 8192 x 8192 bf16 GEMM with fp32 accumulation (cuBLASLt)
};

// Allocates ~1.4 GiB outside any arena for the duration of the measurement; throws
// CudaError when the device cannot.
DevicePeaks measure_device_peaks(int device);

}  // namespace moonrun::cuda
