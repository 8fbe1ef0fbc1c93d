#pragma once
// The one thing the engine needs from a model: logits for a batch of sequences. A runner
// owns the weights and the KDA slot contents; the MLA pages it writes and reads are the
// cache manager's (the runner gets the MlaPoolView when it is built). CPU, CUDA and the
// fake runners of the engine tests all implement this interface.
#include <cstdint>
#include <vector>

#include "common/status.h"
#include "model/forward_batch.h"

namespace moonrun {

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;

  // Appends every sequence's new tokens to its caches (MLA pages listed in seq.pages, KDA
  // slot seq.kda_slot) and writes the logits: one row per sequence (its last new token),
  // or one per new token when seq.all_logits, in batch order.
  // logits: resized to [batch.n_logit_rows(), vocab()]. A non-ok Status means the backend
  // failed; the engine then stops and fails every pending request.
  virtual Status forward(const ForwardBatch& batch, std::vector<float>& logits) = 0;

  virtual int vocab() const = 0;

  // Zeroes the KDA state of slot (conv windows and S) before a new sequence uses it.
  virtual void reset_kda_slot(int slot) = 0;
};

}  // namespace moonrun
