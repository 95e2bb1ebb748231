// The rotary conventions the ops take (docs/spec.md §2.4, §2.5).
#pragma once

#include <cstdint>

namespace kvrope {

//! Which elements of a head row RoPE rotates together.
enum class RotaryStyle : int {
  kRotateHalf = 0,   //!< pairs (i, i + R/2): GPT-NeoX, Llama, Hugging Face's rotate_half
  kInterleaved = 1,  //!< pairs (2i, 2i + 1): GPT-J
};

//! The rotary dim R of a call: `rotary_dim`, or the whole head when it is 0.
constexpr int64_t effective_rotary_dim(int64_t rotary_dim, int64_t head_dim) {
  return rotary_dim == 0 ? head_dim : rotary_dim;
}

//! Element `e` < R of a rotated row pairs with element partner_of(e); `first` tells which of the two
//! comes first, whose formula is out[a] = x[a] cos[a] - x[b] sin[a] (the other: x[b] cos[b] + x[a] sin[b]).
__host__ __device__ constexpr int64_t rotary_partner(RotaryStyle style, int64_t rotary_dim, int64_t e) {
  return style == RotaryStyle::kRotateHalf ? (e < rotary_dim / 2 ? e + rotary_dim / 2 : e - rotary_dim / 2) : (e ^ 1);
}
__host__ __device__ constexpr bool rotary_first(RotaryStyle style, int64_t rotary_dim, int64_t e) {
  return style == RotaryStyle::kRotateHalf ? e < rotary_dim / 2 : (e & 1) == 0;
}
//! The pair index of element e: the column of a table cache [max_position, R] that holds its angle
//! (cos in columns [0, R/2), sin in [R/2, R)).
__host__ __device__ constexpr int64_t rotary_pair_index(RotaryStyle style, int64_t rotary_dim, int64_t e) {
  return style == RotaryStyle::kRotateHalf ? (e < rotary_dim / 2 ? e : e - rotary_dim / 2) : e / 2;
}

}  // namespace kvrope
