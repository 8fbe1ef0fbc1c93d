#pragma once
// NCCL for a group of GPUs: every collective of backend/comm.h on the device, enqueued on
// the rank's CUDA stream (the one its CudaOps runs on, so a collective sits in a step's
// order, and inside a captured graph). Plain C++ here; NCCL's headers stay in the .cpp.
#include <array>
#include <memory>
#include <string>
#include <vector>

#include "backend/comm.h"
#include "common/status.h"

namespace moonrun::cuda {

// NCCL's rendezvous token: made by one process (node 0), handed to the others (the
// control plane carries it as hex).
struct NcclUniqueId {
  std::array<char, 128> bytes{};
  std::string hex() const;
  static Result<NcclUniqueId> from_hex(const std::string& hex);
};
Result<NcclUniqueId> nccl_unique_id();

// The communicators of this process's ranks [first_rank, first_rank + devices.size()) of
// a group of `size`, rank first_rank + i on CUDA device devices[i]. Created together
// (ncclGroupStart/End), so one thread can make them all; the call returns when every rank
// of every process has joined.
Result<std::vector<std::unique_ptr<Communicator>>> make_nccl_comms(const NcclUniqueId& id, int size, int first_rank,
                                                                   const std::vector<int>& devices);

}  // namespace moonrun::cuda
