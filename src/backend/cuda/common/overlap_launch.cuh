#pragma once
// Programmatic dependent launch (Hopper, PTX griddepcontrol): a kernel launched with
// launch_overlapping may start while the kernel before it in the stream is still running.
// Its blocks become resident once every block of the previous kernel has called
// allow_next_grid() (or exited), and wait_for_previous_grid() holds them until the previous
// kernel has finished and its writes are visible.
//
// Why: the routed experts run as four kernels back to back (group, gate/up, down, combine).
// Between two of them the GPU would drain the first kernel's last partial wave, start the
// next grid, and let its first blocks wait for their weight copies with nothing else in
// flight. Overlapped, the next kernel's blocks take each multiprocessor's slots as the last
// blocks leave, and whatever they do before their wait (the down projection's weight tiles
// do not depend on the gate/up output) overlaps the previous kernel's end.
//
// The rule a kernel launched this way keeps: before wait_for_previous_grid() it writes
// nothing but its own shared memory, and reads only what kernels before the previous one
// wrote, and only if the previous kernel calls allow_next_grid() after its own wait (then
// those kernels had finished before this one could start; the previous kernel itself may
// have started early). A kernel that calls wait_for_previous_grid() first is safe after any
// predecessor. Launched normally, both calls are no-ops.
#include <cuda_runtime.h>

#include <utility>

#include "backend/cuda/common/cuda_check.h"

namespace moonrun::cuda {

__device__ __forceinline__ void wait_for_previous_grid() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void allow_next_grid() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }

template <typename... Params, typename... Args>
void launch_overlapping(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream,
                        Args&&... args) {
  cudaLaunchAttribute attr[1] = {};
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  config.attrs = attr;
  config.numAttrs = 1;
  CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

}  // namespace moonrun::cuda
