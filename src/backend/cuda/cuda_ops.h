#pragma once
// The CUDA backend's face: what the runtime needs to make one (plain C++, no CUDA headers).
// The ops themselves are CudaOps (cuda_ops.cpp), every op of backend/ops.h on one GPU: bf16
// weights and activations with fp32 math (MXFP4 experts stay packed for the W4A16
// kernels), or every op in fp32 (--dtype float32, for checking kernels against the CPU
// reference); one device arena of --mem-fraction-static x the card for weights, cache pools
// and per-step scratch; decode steps captured as CUDA graphs.
#include <memory>

#include "backend/comm.h"
#include "backend/cuda/common/device_info.h"
#include "backend/ops.h"
#include "common/status.h"

namespace moonrun::cuda {

struct CudaOpsOptions {
  int device = 0;
  double mem_fraction_static = 0.88;  // of total device memory: weights + caches + scratch
  bool float32 = false;               // every op in fp32 (weights, activations, KV cache)
};

// Selects the device and reserves the arena. Errors (no device, no memory) as a Status.
// comm: the rank's NCCL communicator (nccl_comm.h) in a tensor/expert-parallel group.
Result<std::unique_ptr<Ops>> make_cuda_ops(const CudaOpsOptions& options, std::unique_ptr<Communicator> comm = nullptr);

}  // namespace moonrun::cuda
