#pragma once

namespace moonrun::cuda {

// Number of CUDA devices visible to this process; 0 when there is no driver or no GPU.
int device_count();

}  // namespace moonrun::cuda
