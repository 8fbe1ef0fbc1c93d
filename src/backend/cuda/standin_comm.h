#pragma once
// backend/standin_comm.h on a GPU: the wait is a one-warp kernel spinning latency_us on the
// rank's stream (%globaltimer), the gather's copies device-to-device on that stream, so
// both sit in a step's order and inside its captured graph as an NCCL collective would.
#include <memory>

#include "backend/comm.h"

namespace moonrun::cuda {

std::unique_ptr<Communicator> make_standin_comm(int size, double latency_us);

}  // namespace moonrun::cuda
