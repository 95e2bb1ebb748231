// An append call for the host tests of validate() and the planner: q, k, v as views of one fused
// projection [T, (Hq + 2 H) D], NHD pages of 16, every pointer a fake 16-byte aligned address (neither
// reads memory).
#pragma once

#include <kvrope/kvrope.cuh>

#include <cstdint>

template <typename T, typename C = T>
kvrope::AppendParams<T, C> fake_append(int64_t tokens, int64_t heads, int64_t query_heads, int64_t head_dim) {
  using kvrope::TokenHeads;
  kvrope::AppendParams<T, C> p{};
  p.tokens = tokens;
  p.heads = heads;
  p.query_heads = query_heads;
  p.head_dim = head_dim;
  T* qkv = reinterpret_cast<T*>(0x10000000);
  const int64_t token_stride = (query_heads + 2 * heads) * head_dim;
  p.query = TokenHeads<T>{qkv, token_stride, head_dim};
  p.key = TokenHeads<T>{qkv + query_heads * head_dim, token_stride, head_dim};
  p.value = TokenHeads<const T>{qkv + (query_heads + heads) * head_dim, token_stride, head_dim};
  p.positions = reinterpret_cast<const int64_t*>(0x20000000);
  p.cos_sin_cache_f32 = reinterpret_cast<const float*>(0x30000000);
  p.max_position = 4096;
  p.key_cache = kvrope::nhd_pages(reinterpret_cast<C*>(0x40000000), 16, heads, head_dim);
  p.value_cache = kvrope::nhd_pages(reinterpret_cast<C*>(0x50000000), 16, heads, head_dim);
  p.page_size = 16;
  p.num_pages = 1024;
  p.slot_mapping = reinterpret_cast<const int64_t*>(0x60000000);
  return p;
}
