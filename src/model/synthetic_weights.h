#pragma once
// Deterministic synthetic tensor contents for checkpoints the project writes itself (the
// demo model, K3-width benchmark slices): random, but shaped by what each tensor does so
// that activations stay in a sane range through the layers. Element i's bytes depend only
// on (seed, tensor name, i): a counter-based generator, so any range of a tensor can be
// produced on its own, on any thread, and the same bytes come out on every machine.
#include <cstdint>

#include "model/weight_spec.h"

namespace moonrun {

// How the MoE router's e_score_correction_bias is drawn. Wide (+-0.5: the demo model, whose
// routing decisions stay away from ties) concentrates a batch on the experts with the largest
// biases: at K2's width a batch of 128 touches ~97 of 384 experts instead of the ~358 of a
// uniform router. Balanced (+-0.01) lets each token's own scores decide, as a trained
// model's load-balancing biases do: what a benchmark slice (make-slice) needs, since its
// floor counts the experts a uniform router touches.
enum class RouterBias { wide, balanced };

// Writes elements [first, first + count) of tensor t (its stored dtype) to out.
void synthetic_bytes(const TensorSpec& t, uint64_t seed, int64_t first, int64_t count, uint8_t* out,
                     RouterBias router_bias = RouterBias::wide);

}  // namespace moonrun
