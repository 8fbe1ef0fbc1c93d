#pragma once
// The collectives of a tensor/expert-parallel group, as the backends' ops call them
// (Ops::all_reduce_sum, Ops::all_gather_cols). One implementation per transport:
// backend/cpu/thread_comm.h (ranks as threads of one process, host memory), and NCCL for
// GPUs. Every rank of a group calls the same collectives in the same order with the same
// sizes; the model's forward guarantees that by construction (it is the same code on every
// rank, over the same batch).
//
// A collective that cannot complete (a peer failed, the group was aborted, a timeout)
// throws BackendError on every rank that is waiting in it, so no rank hangs.
#include <cstddef>
#include <string>

namespace moonrun {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // data[0, n) = the sum over the ranks of their data[0, n), on every rank. The sum is
  // taken in rank order, so every rank gets the same bits.
  virtual void all_reduce_sum(float* data, size_t n) = 0;
  // out[r * n, (r + 1) * n) = rank r's in[0, n), on every rank.
  virtual void all_gather(const float* in, size_t n, float* out) = 0;
  // data[0, n) = rank root's data[0, n), on every rank: a pipeline stage's activations to
  // the next stage, over a group of the two (runtime: one such pair per stage boundary and
  // tensor-parallel rank). By default an all-reduce in which every other rank adds zeros:
  // exact (x + 0 = x) on any transport, at twice the bytes of a real broadcast.
  virtual void broadcast(float* data, size_t n, int root) {
    if (rank() != root)
      for (size_t i = 0; i < n; ++i) data[i] = 0.0f;
    all_reduce_sum(data, n);
  }
  // A device communicator enqueues on its rank's stream (the backend's, set once by it).
  virtual void bind_stream(void* stream) {}
  // Wakes every rank waiting in a collective with an error (why): used when one rank failed
  // outside a collective, so the others do not wait for it forever.
  virtual void abort(const std::string& why) = 0;
};

}  // namespace moonrun
