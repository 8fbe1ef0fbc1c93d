#pragma once
// The recurrent state the forward reads and writes, owned outside the model:
// - KdaSlotPool: per (slot, KDA layer) the conv windows and the S matrix of one sequence
//   (K3: 0.43 GiB per sequence over 69 layers). The engine hands a slot to each sequence.
// - MlaPool: storage behind an MlaPoolView (forward_batch.h), the paged latent cache
//   (576 floats per token per MLA layer at K3 size).
#include <vector>

#include "common/check.h"
#include "kernels/cpu/kda.h"
#include "model/config.h"
#include "model/forward_batch.h"
#include "model/layer_dims.h"

namespace moonrun {

class KdaSlotPool {
 public:
  KdaSlotPool(const ModelConfig& cfg, int num_slots)
      : dims_(kda_dims(cfg)), num_slots_(num_slots), num_kda_layers_(cfg.num_kda_layers),
        caches_(static_cast<size_t>(num_slots) * cfg.num_kda_layers) {
    for (auto& c : caches_) c.reset(dims_);
  }
  int num_slots() const { return num_slots_; }
  cpu::KdaCache& at(int slot, int kda_layer) {
    MR_CHECK(slot >= 0 && slot < num_slots_) << "KDA slot " << slot << " of " << num_slots_;
    MR_CHECK(kda_layer >= 0 && kda_layer < num_kda_layers_) << "KDA layer " << kda_layer;
    return caches_[static_cast<size_t>(slot) * num_kda_layers_ + kda_layer];
  }
  // A new sequence starts from zero state.
  void reset(int slot) {
    for (int l = 0; l < num_kda_layers_; ++l) at(slot, l).reset(dims_);
  }

 private:
  cpu::KdaDims dims_;
  int num_slots_;
  int num_kda_layers_;
  std::vector<cpu::KdaCache> caches_;  // [num_slots][num_kda_layers]
};

// Float storage for the MLA latent pool ([num_mla_layers][num_pages][page_size][row]).
class MlaPool {
 public:
  MlaPool(const ModelConfig& cfg, int num_pages, int page_size_tokens)
      : data_(static_cast<size_t>(cfg.num_mla_layers) * num_pages * page_size_tokens * cfg.mla_cache_row()) {
    view_.base = data_.data();
    view_.num_mla_layers = cfg.num_mla_layers;
    view_.num_pages = num_pages;
    view_.page_size_tokens = page_size_tokens;
    view_.row_floats = cfg.mla_cache_row();
  }
  MlaPool(const MlaPool&) = delete;
  MlaPool& operator=(const MlaPool&) = delete;
  const MlaPoolView& view() const { return view_; }

 private:
  std::vector<float> data_;
  MlaPoolView view_;
};

}  // namespace moonrun
