#pragma once
// Deterministic synthetic tensor contents for checkpoints the project writes itself (the
// demo model, K3-width benchmark slices): random, but shaped by what each tensor does so
// that activations stay in a sane range through the layers. Element i's bytes depend only
// on (seed, tensor name, i): a counter-based generator, so any range of a tensor can be
// produced on its own, on any thread, and the same bytes come out on every machine.
#include <cstdint>

#include "model/weight_spec.h"

namespace moonrun {

// Writes elements [first, first + count) of tensor t (its stored dtype) to out.
void synthetic_bytes(const TensorSpec& t, uint64_t seed, int64_t first, int64_t count, uint8_t* out);

}  // namespace moonrun
