#include "backend/cuda/common/cuda_check.h"

#include <cublas_v2.h>

namespace moonrun::cuda {

void throw_cuda_error(const char* call, const char* file, int line, const std::string& reason) {
  throw CudaError(std::string(file) + ":" + std::to_string(line) + ": " + call + ": " + reason);
}

const char* cublas_status_name(cublasStatus_t s) { return cublasGetStatusName(s); }

}  // namespace moonrun::cuda
