#pragma once
// Ranks as processes (or as threads of several processes): the CPU backend's collectives
// over ZeroMQ, for tensor/expert parallelism across nodes without GPUs (and what CI uses
// to check multi-process runs over loopback). Rank 0 hosts a hub (a ROUTER socket); every
// other rank talks to it through a DEALER. A collective sends each rank's buffer to the
// hub, which sums (or concatenates) them in rank order and sends the result back to all:
// every rank gets the same bits, as with the in-process group.
//
// Not for speed (the hub moves W buffers each way): GPUs use NCCL. A collective that does
// not complete within `timeout_s` (a peer died) throws BackendError naming the rank it
// waited for.
#include <memory>
#include <string>

#include "backend/comm.h"
#include "common/status.h"

namespace moonrun::cpu {

struct ZmqCommOptions {
  int rank = 0;
  int size = 1;
  std::string hub_endpoint;  // rank 0 binds it ("tcp://*:PORT"), the others connect ("tcp://HOST:PORT")
  double timeout_s = 60;
};

// Rank 0's hub binds at once; a rank that cannot connect or bind gets an error.
Result<std::unique_ptr<Communicator>> make_zmq_comm(const ZmqCommOptions& options);

}  // namespace moonrun::cpu
