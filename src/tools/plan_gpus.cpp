// GPU table for `moonrun plan` (see plan_gpus.h for where each figure comes from).
#include "tools/plan_gpus.h"

#include <algorithm>
#include <cctype>

namespace moonrun::tools {

namespace {
constexpr uint64_t kGB = 1000ull * 1000 * 1000;
constexpr uint64_t kGiB = 1024ull * 1024 * 1024;
}  // namespace

const std::vector<GpuSpec>& known_gpus() {
  static const std::vector<GpuSpec> kGpus = {
      // The seed's H100 nodes: nvidia-smi 81,559 MiB, PyTorch total capacity 79.19 GiB.
      {"H100", "NVIDIA H100 80GB", 80 * kGB, uint64_t(79.19 * double(kGiB)),
       "measured in the seed (PyTorch total capacity 79.19 GiB)"},
      {"H200", "NVIDIA H200 141GB", 141 * kGB, 141 * kGB, "nominal (8 x H200 = 1,128 GB)"},
      {"B200", "NVIDIA B200 180GB", 180 * kGB, 180 * kGB, "nominal (8 x B200 = 1,440 GB)"},
      {"B300", "NVIDIA B300 (HGX B300, 2.1 TB per 8)", 2100 * kGB / 8, 2100 * kGB / 8,
       "nominal (NVIDIA HGX B300: 2.1 TB per 8 GPUs)"},
      {"GB300", "NVIDIA GB300 NVL72 (279 GB per GPU)", 279 * kGB, 279 * kGB,
       "nominal (NVIDIA GB300 NVL72: 20.1 TB HBM3e over 72 GPUs); not a seed figure"},
  };
  return kGpus;
}

const GpuSpec* find_gpu(const std::string& name) {
  std::string n;
  for (char c : name) n += char(std::toupper(static_cast<unsigned char>(c)));
  if (n.rfind("NVIDIA ", 0) == 0) n = n.substr(7);
  // "H100-80GB", "H100_SXM": the part before the first separator names the chip.
  n = n.substr(0, n.find_first_of("-_ "));
  if (n == "NVL72" || n == "GB300NVL72") n = "GB300";  // "NVL72", "GB300NVL72": the rack
  for (const auto& g : known_gpus())
    if (g.name == n) return &g;
  return nullptr;
}

std::string known_gpu_names() {
  std::string s;
  for (const auto& g : known_gpus()) s += (s.empty() ? "" : ", ") + g.name;
  return s;
}

}  // namespace moonrun::tools
