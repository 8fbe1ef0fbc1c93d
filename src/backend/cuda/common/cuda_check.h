#pragma once
// CUDA and cuBLAS call checks (DESIGN.md "three kinds of errors"). A failed call or kernel
// launch throws CudaError (a BackendError, backend/ops.h) carrying "file:line: call:
// reason". The runner catches it at its step() boundary and returns an internal-error
// Status, so the engine fails its pending requests and /health turns 503; no exception
// leaves the engine thread.
// Kernel launches are followed by CUDA_CHECK_LAUNCH(): a bad launch is never ignored.
#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

#include "backend/ops.h"

namespace moonrun::cuda {

class CudaError : public BackendError {
 public:
  using BackendError::BackendError;
};

[[noreturn]] void throw_cuda_error(const char* call, const char* file, int line, const std::string& reason);
const char* cublas_status_name(cublasStatus_t s);

}  // namespace moonrun::cuda

#define CUDA_CHECK(call)                                                                  \
  do {                                                                                    \
    const cudaError_t mr_cuda_err_ = (call);                                              \
    if (mr_cuda_err_ != cudaSuccess)                                                      \
      ::moonrun::cuda::throw_cuda_error(#call, __FILE__, __LINE__,                        \
                                        cudaGetErrorName(mr_cuda_err_) + std::string(": ") + \
                                            cudaGetErrorString(mr_cuda_err_));            \
  } while (0)

// After every <<<...>>>: launch-configuration errors surface here, at the launch's line.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

#define CUBLAS_CHECK(call)                                                                \
  do {                                                                                    \
    const cublasStatus_t mr_cublas_st_ = (call);                                          \
    if (mr_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                           \
      ::moonrun::cuda::throw_cuda_error(#call, __FILE__, __LINE__,                        \
                                        ::moonrun::cuda::cublas_status_name(mr_cublas_st_)); \
  } while (0)
