#pragma once
// MXFP4 (OCP Microscaling FP4, K3_SPEC.md §3): the routed experts' storage format.
// A row of `in` weights is in/2 bytes of E2M1 codes plus in/32 E8M0 scales. Element j sits in
// byte j/2: the low nibble holds even j, the high nibble odd j. A nibble is sign (bit 3) and
// a 3-bit magnitude index into {0, 0.5, 1, 1.5, 2, 3, 4, 6}; each group of 32 consecutive
// elements shares the scale 2^(s - 127). compressed-tensors stores the codes as
// weight_packed [out, in/2] and gpt-oss as *_blocks [out, in/32, 16]: the same bytes.
#include <cstdint>

namespace moonrun::cpu {

// The E2M1 value of a 4-bit code (sign included).
float fp4_e2m1_value(uint8_t nibble);
// 2^(s - 127); s = 255 is NaN in the spec (never produced by quantisers; we return NaN).
float e8m0_scale(uint8_t s);

// Dequantises a [rows, cols] MXFP4 matrix: codes [rows, cols/2], scales [rows, cols/32].
// out: [rows, cols] float32. cols must be a multiple of 32.
void dequantize_mxfp4(const uint8_t* codes, const uint8_t* scales, int rows, int cols, float* out);

}  // namespace moonrun::cpu
