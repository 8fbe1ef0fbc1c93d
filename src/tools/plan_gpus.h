#pragma once
// The GPUs `moonrun plan` knows, with the figures the seeds use. Memory is given twice:
// the nominal per-GPU size that the "92 % of the VM's memory minus the checkpoint" rule of
// the seeds works from (8 x H200 = 1,128 GB, 8 x B200 = 1,440 GB, 8 x B300 = 2,100 GB), and
// what an engine can actually allocate per card (measured on H100 in the seed: PyTorch's
// total capacity 79.19 GiB; nominal elsewhere until someone measures it).
#include <cstdint>
#include <string>
#include <vector>

namespace moonrun::tools {

struct GpuSpec {
  std::string name;                 // "H100", as --gpu takes it (case-insensitive)
  std::string label;                // "NVIDIA H100 80GB"
  uint64_t nominal_bytes = 0;       // per GPU, decimal, as sold
  uint64_t usable_bytes = 0;        // per GPU, what the allocator reports as total
  std::string usable_source;        // where usable_bytes comes from
};

const std::vector<GpuSpec>& known_gpus();
// Case-insensitive; accepts "H100", "h100-80gb", "B300", "GB300". nullptr when unknown.
const GpuSpec* find_gpu(const std::string& name);
std::string known_gpu_names();      // "H100, H200, B200, B300, GB300" for messages

}  // namespace moonrun::tools
