#pragma once
// INT4 symmetric, group 32: the K2 release's routed experts (compressed-tensors
// `pack-quantized`, issue 40). A row of `in` weights is in/8 int32 words plus in/32 bf16 scales.
// Element j sits in word j/8 at bits 4*(j%8) .. 4*(j%8)+3 as u4 = q + 8, q in [-8, 7]; the
// group of 32 consecutive elements j/32 shares one scale, and weight = q * scale.
//
// Confirmed against compressed-tensors' own code (vllm-project/compressed-tensors,
// src/compressed_tensors/compressors/quantized_compressors/pack_quantized.py): pack_to_int32
// adds offset = 1 << (num_bits - 1) = 8 before packing, views the row as groups of
// pack_factor = 32 / num_bits = 8 along the input (packed_dim 1 for weights) and sums
// `value << arange(8) * 4`, so value i of a group is at bits 4i..4i+3 (the first element in
// the lowest nibble); unpack_from_int32 reads `(word >> 4i) & 0xF` into column i::8 and
// subtracts 8. The scale (quantization/utils/helpers.py calculate_qparams) is
// absmax / ((7 - (-8)) / 2) = absmax / 7.5 and is stored in the weight's dtype.
#include <cstdint>

namespace moonrun::cpu {

// The signed value q in [-8, 7] of element i (0..7) of a packed word.
inline int int4_value(uint32_t word, int i) { return static_cast<int>((word >> (4 * i)) & 0xFu) - 8; }

// Dequantises a [rows, cols] INT4 matrix: words [rows, cols/8], bf16 scales [rows, cols/32].
// out: [rows, cols] float32. cols must be a multiple of 32.
void dequantize_int4_g32(const uint32_t* words, const uint16_t* scales_bf16, int rows, int cols, float* out);

}  // namespace moonrun::cpu
