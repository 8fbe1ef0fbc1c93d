#pragma once
// A stand-in for a group's collectives, to time one rank of a tensor-parallel group on one
// device (bench-model --standin-collective-us; issue 41): rank 0 of `size`, with no peers.
// all_reduce_sum leaves the rank's data as it is, all_gather copies the rank's part into
// every rank's slot, and each first waits `latency_us` (the GPU one: a kernel spinning that
// long on the rank's stream, where a small NCCL collective would sit). A step then takes
// what one rank of a real group takes with collectives of that latency: the rank's own
// shard of every kernel, in the order the forward issues them, captured in the same graphs.
// Its values are not the group's (every other rank's part is missing or a copy of this
// one's), so it serves timing only, never output.
#include <memory>

#include "backend/comm.h"

namespace moonrun {

// Host memory (the CPU backend): the wait is a busy wait.
std::unique_ptr<Communicator> make_standin_comm(int size, double latency_us);

}  // namespace moonrun
