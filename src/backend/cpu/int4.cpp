#include "backend/cpu/int4.h"

#include "common/check.h"
#include "common/dtype.h"

namespace moonrun::cpu {

void dequantize_int4_g32(const uint32_t* words, const uint16_t* scales_bf16, int rows, int cols, float* out) {
  MR_CHECK(cols % 32 == 0) << "INT4 rows of " << cols << " elements (a multiple of 32 is needed)";
  const int words_per_row = cols / 8, groups_per_row = cols / 32;
  for (int r = 0; r < rows; ++r) {
    const uint32_t* w = words + static_cast<int64_t>(r) * words_per_row;
    const uint16_t* s = scales_bf16 + static_cast<int64_t>(r) * groups_per_row;
    float* o = out + static_cast<int64_t>(r) * cols;
    for (int g = 0; g < groups_per_row; ++g) {
      const float scale = bf16_to_f32(s[g]);
      for (int k = 0; k < 4; ++k) {  // four words of eight elements per group
        const uint32_t word = w[g * 4 + k];
        for (int i = 0; i < 8; ++i) o[g * 32 + k * 8 + i] = static_cast<float>(int4_value(word, i)) * scale;
      }
    }
  }
}

}  // namespace moonrun::cpu
