// The backward of "write RoPE'd keys and values into a static KV cache": validation and launchers.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <tuple>

#include "backward_params.cuh"
#include "core/arch.cuh"
#include "core/dispatch.cuh"
#include "core/dtype.cuh"
#include "core/status.cuh"
#include "detail/backward_kernel.cuh"
#include "detail/decode_kernel.cuh"
#include "detail/validate.cuh"

namespace kvrope {

//! Which kernel instance a call takes.
enum class BackwardPath : int {
  kNothingToDo = 0,     //!< no element to read or write (for example B = 0): nothing is launched
  kCompiledHeadDim,     //!< head_dim has a compile-time instance, 16-byte accesses
  kGenericVectorized,   //!< head_dim read at run time, 16-byte accesses
  kGenericScalar,       //!< pointers or strides not 16-byte aligned (or D/2 not a multiple of the vector): one element per access
};

//! What a call launches: filled by plan_backward without launching anything.
struct BackwardPlan {
  BackwardPath path = BackwardPath::kNothingToDo;
  int head_dim_instance = 0;  //!< compiled head dim, 0 for the generic paths
  int vec_width = 0;          //!< elements per access
  int grid = 0;               //!< blocks of the persistent grid
  int block = 0;              //!< threads per block
  int shared_bytes = 0;       //!< dynamic shared memory per block (the bitmask of rows in cache_position, and the bulk-copy stages)
  int token_warps = 0;        //!< out-of-place: warps of each block doing token work; the others copy the caches
  bool bulk_copy = false;     //!< out-of-place: one warp per block copies the caches with the bulk-copy engine (sm_90+)
  int token_parts = 1;        //!< warps sharing one token (a power of two): more when tokens are fewer than token warps
  int bulk_chunk_rows = 0;    //!< with bulk_copy: cache rows per chunk of the copy (fewer than a 32 KiB stage holds for small caches)
  int bulk_speculated_chunks = 0;  //!< with bulk_copy: chunks each block loads before its bitmask exists (when the positions fit one round of the bitmask's loads)
  bool token_zeros = false;   //!< the token warps write the zeros of rows cache_position of the cache-input gradients
  int token_prefetch = 0;     //!< in-place: LaunchTuning::in_place_token_prefetch as applied (0 where it does not apply: out of place, the scalar path, device code below sm_90)
  bool decode = false;        //!< the kernel for one token a batch (S == 1, LaunchTuning::decode_kernel): no bitmask, 1, 2 or 4 warps a token (token_parts), out of place a register copy
  bool token_items_spread = false;  //!< the first token items dealt to the blocks in turn: LaunchTuning::in_place_spread_items (in place, with a block per item up to one wave) or out_of_place_spread_items as applied
  int64_t bulk_shared_chunks = 0;  //!< chunks the blocks take from the workspace's counter at run time (bulk copy, a workspace, bulk_share_chunks, more than bulk_share_min_chunks_per_block chunks a block and more than the rings hold, one bitmask window; else 0)
};

namespace detail {

#define KVROPE_DETAIL_HEAD_STRIDES(x) {#x ".batch_stride", #x ".head_stride", #x ".seq_stride"}
#define KVROPE_DETAIL_TOKEN_STRIDES(x) {#x ".batch_stride", #x ".seq_stride"}

template <typename T, typename Pos>
std::array<Layout, 4> common_inputs(const BackwardCommon<T, Pos>& p) {
  const bool tables = p.grad_cos.data != nullptr || p.grad_sin.data != nullptr;
  const int64_t key_batch = tables ? p.batch : 0;  // key_states is not read without table gradients
  const int64_t table_batch = p.heads > 0 ? p.batch : 0;
  Layout pos{"cache_position", p.cache_position, int64_t{sizeof(Pos)}, 1, 1, {p.batch > 0 ? p.seq_len : 0, 1, 1},
             {1, 0, 0}, {"cache_position", nullptr, nullptr}};
  return {head_layout("key_states", KVROPE_DETAIL_HEAD_STRIDES(key_states), p.key_states, key_batch, p.heads,
                      p.seq_len, p.head_dim),
          token_layout("cos", KVROPE_DETAIL_TOKEN_STRIDES(cos), p.cos, table_batch, p.seq_len, p.head_dim),
          token_layout("sin", KVROPE_DETAIL_TOKEN_STRIDES(sin), p.sin, table_batch, p.seq_len, p.head_dim), pos};
}

template <typename T, typename Pos>
std::array<Layout, 4> common_outputs(const BackwardCommon<T, Pos>& p) {
  return {head_layout("grad_key_states", KVROPE_DETAIL_HEAD_STRIDES(grad_key_states), p.grad_key_states, p.batch,
                      p.heads, p.seq_len, p.head_dim),
          head_layout("grad_value_states", KVROPE_DETAIL_HEAD_STRIDES(grad_value_states), p.grad_value_states,
                      p.batch, p.heads, p.seq_len, p.head_dim),
          token_layout("grad_cos", KVROPE_DETAIL_TOKEN_STRIDES(grad_cos), p.grad_cos,
                       p.grad_cos.data ? p.batch : 0, p.seq_len, p.head_dim),
          token_layout("grad_sin", KVROPE_DETAIL_TOKEN_STRIDES(grad_sin), p.grad_sin,
                       p.grad_sin.data ? p.batch : 0, p.seq_len, p.head_dim)};
}

// A [B, H, S_max, D] cache (or cache gradient) of the call.
template <typename T, typename Pos, typename V>
Layout cache_layout(const BackwardCommon<T, Pos>& p, const char* name, const char* const (&strides)[3],
                    const HeadRows<V>& view) {
  return head_layout(name, strides, view, p.batch, p.heads, p.cache_len, p.head_dim);
}

template <typename T, size_t N, size_t M>
std::array<T, N + M> concat(const std::array<T, N>& a, const std::array<T, M>& b) {
  std::array<T, N + M> out;
  std::copy(a.begin(), a.end(), out.begin());
  std::copy(b.begin(), b.end(), out.begin() + N);
  return out;
}

template <typename T>
bool aligned16(const HeadRows<T>& v) {
  return reinterpret_cast<uintptr_t>(v.data) % 16 == 0 && (v.batch_stride * sizeof(T)) % 16 == 0 &&
         (v.head_stride * sizeof(T)) % 16 == 0 && (v.seq_stride * sizeof(T)) % 16 == 0;
}
template <typename T>
bool aligned16(const TokenRows<T>& v) {
  return reinterpret_cast<uintptr_t>(v.data) % 16 == 0 && (v.batch_stride * sizeof(T)) % 16 == 0 &&
         (v.seq_stride * sizeof(T)) % 16 == 0;
}

template <typename T, typename Pos>
BackwardArgs<T> make_args(const BackwardCommon<T, Pos>& p, HeadRows<const T> gk, HeadRows<const T> gv,
                          HeadRows<T> gk_out, HeadRows<T> gv_out, bool in_place) {
  const int64_t rows = std::max<int64_t>(p.cache_len, 1);
  BackwardArgs<T> a{};
  a.batch = p.batch;
  a.heads = p.heads;
  a.seq_len = p.seq_len;
  a.cache_len = p.cache_len;
  a.head_dim = p.head_dim;
  a.gk = gk;
  a.gv = gv;
  a.gk_out = gk_out;
  a.gv_out = gv_out;
  a.key = p.key_states;
  a.cos = p.cos;
  a.sin = p.sin;
  a.grad_key = p.grad_key_states;
  a.grad_value = p.grad_value_states;
  a.grad_cos = p.grad_cos;
  a.grad_sin = p.grad_sin;
  a.positions = p.cache_position;
  a.positions_are_int64 = sizeof(Pos) == 8;
  a.in_place = in_place;
  a.error_flag = p.error_flag;
  a.window_rows = std::min<int64_t>((rows + 31) / 32 * 32, kMaxWindowRows);
  a.div_seq = FastDivmod(static_cast<uint32_t>(std::max<int64_t>(p.seq_len, 1)));
  a.div_heads = FastDivmod(static_cast<uint32_t>(std::max<int64_t>(p.heads, 1)));
  return a;
}

// log2 of the warps that share a token: as many as `token_warps` warps allow for `tokens` tokens (a
// token's work then has fewer dependent instructions per lane), up to the most that leave no lane
// without a head row chunk, and at most 8.
inline int token_parts_log2(int64_t tokens, int64_t token_warps, int64_t heads, int64_t head_dim, int token_vec) {
  const int64_t pairs = head_dim / 2 / token_vec;
  int64_t slots = 1;
  while (slots < 32 && slots < heads) slots *= 2;
  int log2 = 0;
  while (log2 < 3 && pairs * slots >= (int64_t{64} << log2) && tokens * (int64_t{2} << log2) <= token_warps) ++log2;
  return log2;
}

// A per-thread cache of a host-side query (each costs microseconds of host time): the value for
// `key`, computed by query(&value) on a miss; the 8 newest keys are kept. One cache per call site.
template <typename Key, typename Value, typename Query>
Status cached_query(const Key& key, Value* out, Query&& query) {
  struct Entry {
    Key key;
    Value value;
  };
  thread_local Entry cache[8] = {};
  thread_local int used = 0, next = 0;
  for (int i = 0; i < used; ++i)
    if (cache[i].key == key) {
      *out = cache[i].value;
      return {};
    }
  if (Status s = query(out); !s) return s;
  cache[next] = Entry{key, *out};
  next = (next + 1) % 8;
  used = used < 8 ? used + 1 : 8;
  return {};
}

// Whether `kernel`'s device code was compiled for sm_90 or later (the bulk copy; the in-place token
// prefetch, measured only there).
// A build that carries only PTX for an older GPU runs on Hopper through the JIT with the register
// copy in its code, so the device's compute capability alone does not tell. Cached per kernel and
// device.
template <typename Kernel>
Status kernel_has_sm90_code(Kernel kernel, int device, bool* out) {
  return cached_query(std::make_tuple(reinterpret_cast<const void*>(kernel), device), out, [&](bool* sm90) {
    cudaFuncAttributes attr{};
    if (Status s = cuda_status(cudaFuncGetAttributes(&attr, kernel), "cudaFuncGetAttributes"); !s) return s;
    *sm90 = attr.ptxVersion >= 90;
    return Status{};
  });
}

// Blocks of `kernel` resident per SM at this block size; cached per kernel, device and shape since
// the occupancy query costs a few microseconds of host time. With `allowed_shared` > 0, the first
// query of a kernel on a device also allows it that much dynamic shared memory (the largest any of
// its launches asks for, above the default 48 KiB); 0 leaves the default.
template <typename Kernel>
Status resident_blocks(Kernel kernel, int device, int block, int shared_bytes, int allowed_shared, int* out) {
  const auto key = std::make_tuple(reinterpret_cast<const void*>(kernel), device, block, shared_bytes);
  return cached_query(key, out, [&](int* blocks) {
    if (allowed_shared > 0)
      if (Status s = cuda_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, allowed_shared),
                                 "cudaFuncSetAttribute");
          !s)
        return s;
    return cuda_status(cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, kernel, block, shared_bytes),
                       "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  });
}

// The fused kernel's instance of a head dim and access width for the call's variant (kInPlace).
template <typename T, int kD, int kVec>
auto fused_instance(bool in_place) {
  return in_place ? backward_kernel<T, kD, kVec, true> : backward_kernel<T, kD, kVec, false>;
}

// The decode kernel's instance for a head dim (decode_head_dim_ok): compiled for the power-of-two
// head dims of kCompiledHeadDims, else the generic one (D read at run time); *instance says which.
template <typename T>
auto decode_instance(int64_t head_dim, int* instance) {
  using Kernel = void (*)(BackwardArgs<T>);
  return dispatch_head_dim(head_dim, [&](auto d) -> Kernel {
    constexpr int kD = decltype(d)::value;
    if constexpr (kD > 0 && decode_head_dim_ok<T>(kD)) {
      *instance = kD;
      return decode_kernel<T, kD>;
    } else {
      *instance = 0;
      return decode_kernel<T, 0>;
    }
  });
}

// The decode kernel (S == 1; BackwardPlan::decode) for `a`, on a vectorized call on `device`: fills
// `plan` (vector width already set by the caller) and launches unless `plan_only`. In place, a block
// is a token's warps. Out of place, the first warps of the first min(B, grid) blocks do the tokens,
// and the grid has as many blocks of decode_block_threads as the copy can use (kDecodeCopyPairs
// pairs of 16-byte vectors a thread), up to one wave.
template <typename T>
Status launch_decode(const BackwardArgs<T>& a, const LaunchTuning& tune, int device, int sms, BackwardPlan& plan,
                     cudaStream_t stream, BackwardPlan* plan_out, bool plan_only) {
  constexpr int kWide = 16 / sizeof(T);
  const auto kernel = decode_instance<T>(a.head_dim, &plan.head_dim_instance);
  plan.path = plan.head_dim_instance ? BackwardPath::kCompiledHeadDim : BackwardPath::kGenericVectorized;
  plan.decode = true;
  // A token's warps (decode_token_warps); out of place the block also has at least one copy warp.
  const int token_warps = decode_token_warps<T>(tune.decode_token_warps, a.heads, a.head_dim, a.in_place);
  plan.block = a.in_place ? 32 * token_warps
                          : std::clamp(tune.decode_block_threads / 32 * 32, 32 * (token_warps + 1), kDecodeMaxBlockThreads);
  plan.shared_bytes = 0;  // (the kernel's position slots are static shared memory)
  plan.token_warps = a.in_place ? 0 : token_warps;
  plan.token_parts = token_warps;
  int resident = 0;
  if (Status s = resident_blocks(kernel, device, plan.block, plan.shared_bytes, 0, &resident); !s) return s;
  const int64_t grid_max = int64_t{sms} * std::max(1, resident);
  const int64_t vectors = a.in_place ? 0 : 2 * a.batch * a.heads * a.cache_len * a.head_dim / kWide;
  const int64_t per_block = int64_t{plan.block} * 2 * kDecodeCopyPairs;  // vectors a block's round has
  const int64_t copy_blocks = (vectors + per_block - 1) / per_block;
  plan.grid = static_cast<int>(std::clamp<int64_t>(std::max(copy_blocks, a.batch), 1, grid_max));
  BackwardArgs<T> args = a;
  args.decode_token_blocks = std::min<int64_t>(a.batch, plan.grid);
  args.decode_token_warps = token_warps;
  args.decode_slab_vecs = FastDivmod(static_cast<uint32_t>(std::max<int64_t>(1, a.cache_len * a.head_dim / kWide)));
  if (plan_out) *plan_out = plan;
  if (plan_only) return {};
  kernel<<<plan.grid, plan.block, plan.shared_bytes, stream>>>(args);
  return cuda_status(cudaGetLastError(), "kernel launch");
}

// Picks the instance and the grid; launches it unless `plan_only`.
template <typename T>
Status plan_and_launch(const BackwardArgs<T>& a, const LaunchTuning* tuning, cudaStream_t stream,
                       BackwardPlan* plan_out, bool plan_only) {
  static_assert(kIsSupportedType<T>, "kvrope: T must be __nv_bfloat16, __half or float");
  constexpr int kWide = 16 / sizeof(T);
  BackwardPlan plan{};
  const int64_t tokens = a.batch * a.seq_len;
  const int64_t copy_elems = a.in_place ? 0 : 2 * a.batch * a.heads * a.cache_len * a.head_dim;
  if (a.batch == 0 || (tokens == 0 && copy_elems == 0)) {
    if (plan_out) *plan_out = plan;
    return {};
  }
  const bool tables = a.wants_tables();
  const bool vec = a.head_dim % (2 * kWide) == 0 && aligned16(a.gk) && aligned16(a.gv) && aligned16(a.gk_out) &&
                   aligned16(a.gv_out) && (!tables || aligned16(a.key)) && aligned16(a.cos) && aligned16(a.sin) &&
                   aligned16(a.grad_key) && aligned16(a.grad_value) && aligned16(a.grad_cos) &&
                   aligned16(a.grad_sin);

  using Kernel = void (*)(BackwardArgs<T>);
  Kernel kernel = fused_instance<T, 0, 1>(a.in_place);
  plan.path = BackwardPath::kGenericScalar;
  plan.vec_width = 1;
  if (vec) {
    plan.vec_width = kWide;
    plan.head_dim_instance = dispatch_head_dim(a.head_dim, [&](auto head_dim) {
      kernel = fused_instance<T, decltype(head_dim)::value, kWide>(a.in_place);
      return decltype(head_dim)::value;
    });
    plan.path = plan.head_dim_instance ? BackwardPath::kCompiledHeadDim : BackwardPath::kGenericVectorized;
  }

  int device = 0, sms = 0, major = 0, minor = 0, shared_optin = 0;
  if (Status s = cuda_status(cudaGetDevice(&device), "cudaGetDevice"); !s) return s;
  if (Status s = cuda_status(cudaDeviceGetAttribute(&shared_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), "cudaDeviceGetAttribute"); !s) return s;
  if (Status s = cuda_status(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute"); !s) return s;
  if (Status s = cuda_status(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "cudaDeviceGetAttribute"); !s) return s;
  if (Status s = cuda_status(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device), "cudaDeviceGetAttribute"); !s) return s;
  const LaunchTuning tune = tuning ? *tuning : default_tuning(major, minor);
  // (H = 0 keeps the fused kernel: its tables may then be null, and the decode kernel reads them first.)
  if (tune.decode_kernel && a.seq_len == 1 && a.heads > 0 && vec && decode_head_dim_ok<T>(a.head_dim)) {
    // Out of place only for caches the register copy suits (decode_copy_max_mib), and of fewer than
    // 2^31 16-byte vectors each: its copy indexes them in 32 bits.
    const int64_t cache_bytes = copy_elems * int64_t{sizeof(T)};
    if (a.in_place || (a.cache_len > 0 && copy_elems / 2 / kWide < (int64_t{1} << 31) &&
                       cache_bytes <= (int64_t{std::max(tune.decode_copy_max_mib, 0)} << 20)))
      return launch_decode(a, tune, device, sms, plan, stream, plan_out, plan_only);
  }
  // At least two warps: out of place, a block splits its warps between token and copy work.
  plan.block = std::clamp(tune.block_threads / 32 * 32, 64, kMaxBlockThreads);
  // The bulk copy's ring: as many stages as asked for that fit the device's shared memory per block
  // (all 6 on H100, H200 and B200; fewer on GPUs with less); under 2, the register copy.
  const int64_t row_bytes = a.head_dim * int64_t{sizeof(T)};
  const int64_t ring_offset = bulk_ring_offset(mask_bytes(a.window_rows));
  const int fitting = static_cast<int>(std::max<int64_t>(0, (shared_optin - ring_offset) / bulk_ring_bytes(1)));
  const int stages = std::min(std::clamp(tune.bulk_stages, 2, kMaxBulkStages), fitting);
  bool sm90_code = false;  // the bulk copy, and where the in-place token prefetch was measured
  if (major >= 9)
    if (Status s = kernel_has_sm90_code(kernel, device, &sm90_code); !s) return s;
  plan.bulk_copy = tune.bulk_copy && vec && !a.in_place && copy_elems > 0 && sm90_code &&
                   row_bytes <= kBulkStageBytes && plan.block >= 64 && stages >= 2;
  const int slack = std::clamp(tune.bulk_store_slack, 1, std::max(1, std::min(stages - 1, kMaxBulkSlack)));
  plan.shared_bytes = static_cast<int>(plan.bulk_copy ? ring_offset + bulk_ring_bytes(stages) : mask_bytes(a.window_rows));
  int resident = 0;
  // The fused kernel: up to the bitmask and the bulk copy's ring, within what the device allows a block.
  const int allowed_shared = static_cast<int>(std::min<int64_t>(kMaxSharedBytes, shared_optin));
  if (Status s = resident_blocks(kernel, device, plan.block, plan.shared_bytes, allowed_shared, &resident); !s) return s;
  // One wave: never more blocks than fit on the device at once (the grid is persistent).
  const int64_t grid_max = int64_t{sms} * std::max(1, std::min(tune.blocks_per_sm, resident));
  const int64_t warps = plan.block / 32;
  const int token_vec = std::min(plan.vec_width, kTokenVecMax);  // kTokenVec
  // Warps a token (log2): LaunchTuning::token_parts, or as many as `warps_total` token warps allow
  // (token_parts_log2). In place, where every warp does token work, a token is split only while the
  // tokens' warps number at most kInPlaceSplitWarpsPerSm a SM: more warps on an SM slow one another
  // on the way to their loads. On the H200, with 293-691 tokens, two warps a token (4.4-10.5 a SM)
  // were as fast as one or up to 7 % slower, four (8.9 a SM) 10 % slower (docs/perf-notes.md, v15).
  constexpr int64_t kInPlaceSplitWarpsPerSm = 4;
  auto parts_log2_for = [&](int64_t warps_total) {
    if (tune.token_parts > 0) {
      int log2 = 0;
      while (log2 < 3 && (2 << log2) <= tune.token_parts) ++log2;
      return log2;
    }
    const int64_t split_warps = a.in_place ? std::min<int64_t>(warps_total, kInPlaceSplitWarpsPerSm * sms) : warps_total;
    return token_parts_log2(tokens, split_warps, a.heads, a.head_dim, token_vec);
  };
  // Token work needing no copy role beside it (in-place, or no cache rows): split the tokens as the
  // rule allows, then take the blocks that need.
  const int64_t lone_parts = int64_t{1} << parts_log2_for(grid_max * warps);
  const int64_t token_blocks_max = (tokens * lone_parts + warps - 1) / warps;
  plan.grid = static_cast<int>(grid_max);
  int speculate = 0;
  bool small_cache = false;
  if (plan.bulk_copy) {
    // One copy warp per block, all others token warps; enough blocks for either role.
    plan.token_warps = static_cast<int>(warps - 1);
    // Small caches: chunks of fewer rows (down to 4 KiB), so that the copy spreads over every SM with
    // several chunks in each block's ring (LaunchTuning::bulk_min_chunks_per_block).
    BackwardArgs<T> sized = a;
    const int64_t chunk_bytes = std::clamp<int64_t>(tune.bulk_chunk_bytes, kMinBulkChunkBytes, kBulkStageBytes);
    sized.bulk_chunk_rows = static_cast<int>(std::max<int64_t>(1, chunk_bytes / row_bytes));
    int64_t chunks = bulk_window(sized, row_window(sized, 0)).total;
    while (chunks < int64_t{tune.bulk_min_chunks_per_block} * grid_max && sized.bulk_chunk_rows % 2 == 0 &&
           sized.bulk_chunk_rows * row_bytes >= 2 * kMinBulkChunkBytes) {
      sized.bulk_chunk_rows /= 2;
      chunks = bulk_window(sized, row_window(sized, 0)).total;
    }
    plan.bulk_chunk_rows = sized.bulk_chunk_rows;
    const int64_t token_blocks = (tokens + plan.token_warps - 1) / plan.token_warps;
    plan.grid = static_cast<int>(std::clamp<int64_t>(std::max(chunks, token_blocks), 1, grid_max));
    // Small caches (a few chunks per block): the loads of the chunks the ring holds need not wait for the bitmask.
    // Its rows in cache_position are loaded for nothing, but they are then in L2 for the token work.
    // Only when the token warps load every position in at most bulk_speculate_mask_rounds rounds: a
    // later round's loads queue behind these (docs/perf-notes.md, v5; a second round still gained, v15).
    small_cache = chunks <= kSpeculateChunksPerBlock * int64_t{plan.grid};
    const int64_t mask_round = int64_t{kMaskLoads} * 32 * plan.token_warps;
    if ((small_cache || tune.bulk_speculate_large) && a.seq_len <= mask_round * std::max(1, tune.bulk_speculate_mask_rounds))
      speculate = std::clamp(tune.bulk_speculate_chunks, 0, stages);
  } else if (a.in_place) {
    // The fewest blocks whose warps hold the items, or a block per item (in_place_spread_items).
    const int64_t blocks = tune.in_place_spread_items ? tokens * lone_parts : token_blocks_max;
    plan.grid = static_cast<int>(std::clamp<int64_t>(blocks, 1, grid_max));
  } else if (tokens == 0) {
    plan.token_warps = 0;
    const int64_t copy_blocks = (copy_elems / plan.vec_width + int64_t{plan.block} * kCopyUnroll - 1) /
                                (int64_t{plan.block} * kCopyUnroll);
    plan.grid = static_cast<int>(std::clamp<int64_t>(copy_blocks, 1, grid_max));
  } else if (copy_elems == 0) {
    plan.token_warps = static_cast<int>(warps);
    plan.grid = static_cast<int>(std::clamp<int64_t>(token_blocks_max, 1, grid_max));
  } else {
    // Split each block's warps between the roles in proportion to the bytes each moves.
    const double token_bytes = double(tokens) * double(a.head_dim) * (5.0 * double(a.heads) + 4.0);
    const double copy_bytes = 2.0 * double(copy_elems);
    const double share = token_bytes / (token_bytes + tune.token_warp_weight * copy_bytes);
    plan.token_warps = static_cast<int>(std::clamp<int64_t>(std::llround(double(warps) * share), 1, warps - 1));
    // Small problems: no more blocks than either role can use.
    const int64_t copy_threads = (warps - plan.token_warps) * 32;
    const int64_t copy_blocks = (copy_elems / plan.vec_width + copy_threads * kCopyUnroll - 1) / (copy_threads * kCopyUnroll);
    const int64_t token_blocks = (tokens + plan.token_warps - 1) / plan.token_warps;
    plan.grid = static_cast<int>(std::clamp<int64_t>(std::max(copy_blocks, token_blocks), 1, grid_max));
  }
  // The token warps the grid has, and so how many share a token.
  const int64_t grid_token_warps = int64_t{plan.grid} * (a.in_place ? warps : plan.token_warps);
  const int parts_log2 = parts_log2_for(grid_token_warps);
  plan.token_parts = 1 << parts_log2;
  BackwardArgs<T> args = a;
  args.token_warps = plan.token_warps;
  args.bulk = plan.bulk_copy;
  args.token_parts_log2 = parts_log2;
  args.bulk_speculate = speculate;
  plan.bulk_speculated_chunks = speculate;
  args.token_zeros = tune.token_zeros && speculate > 0 && small_cache;
  plan.token_zeros = args.token_zeros;
  args.mask_late = plan.bulk_copy && tune.mask_after_first_item;
  args.token_prefetch = a.in_place && sm90_code && vec ? std::clamp(tune.in_place_token_prefetch, 0, 3) : 0;
  plan.token_prefetch = args.token_prefetch;
  args.spread_items = a.in_place ? tune.in_place_spread_items : tune.out_of_place_spread_items;
  plan.token_items_spread = args.spread_items;
  args.bulk_stages = stages;
  args.bulk_slack = slack;
  args.bulk_chunk_rows = plan.bulk_chunk_rows;
  args.windows = a.cache_len == 0 ? 1 : (a.cache_len + a.window_rows - 1) / a.window_rows;
  args.workspace = nullptr;  // the caller's workspace goes to the kernel only when chunks are shared through it
  if (plan.bulk_copy) {  // the copy warp's first chunks without a division on its path
    args.bulk_first = bulk_window(args, row_window(args, 0));
    args.bulk_per_block = bulk_chunks_per_block(args.bulk_first.total, plan.grid);
    // A cache of more than bulk_share_min_chunks_per_block chunks a block and a workspace: each
    // block copies its first ring's worth of chunks, and the blocks take the rest from the
    // workspace's counter as they go (ChunkSource).
    const int64_t total = args.bulk_first.total;
    const int64_t fixed = std::min<int64_t>(args.bulk_per_block, stages);
    const int64_t shared_chunks = total - fixed * plan.grid;
    constexpr int64_t kMaxTickets = int64_t{1} << 31;
    if (a.workspace != nullptr && tune.bulk_share_chunks && args.windows == 1 &&
        total > int64_t{tune.bulk_share_min_chunks_per_block} * plan.grid && shared_chunks > 0 &&
        shared_chunks < kMaxTickets) {
      args.bulk_per_block = fixed;
      args.share_chunks = true;
      args.workspace = a.workspace;
      plan.bulk_shared_chunks = shared_chunks;
    }
  }
  if (plan_out) *plan_out = plan;
  if (plan_only) return {};

  kernel<<<plan.grid, plan.block, plan.shared_bytes, stream>>>(args);
  return cuda_status(cudaGetLastError(), "kernel launch");
}

}  // namespace detail

//! Checks an out-of-place call without touching the device: sizes, required pointers (a tensor with
//! no elements may be null), non-negative strides, outputs whose rows don't overlap, and outputs
//! that overlap no input and no other output. Returns the first problem with the field's name.
template <typename T, typename Pos>
Status validate(const BackwardParams<T, Pos>& p) {
  using namespace detail;
  if (Status s = check_common_sizes(p); !s) return s;
  const std::array<Layout, 2> caches{
      cache_layout(p, "grad_key_cache", KVROPE_DETAIL_HEAD_STRIDES(grad_key_cache), p.grad_key_cache),
      cache_layout(p, "grad_value_cache", KVROPE_DETAIL_HEAD_STRIDES(grad_value_cache), p.grad_value_cache)};
  const std::array<Layout, 2> cache_grads{
      cache_layout(p, "grad_key_cache_input", KVROPE_DETAIL_HEAD_STRIDES(grad_key_cache_input),
                   p.grad_key_cache_input),
      cache_layout(p, "grad_value_cache_input", KVROPE_DETAIL_HEAD_STRIDES(grad_value_cache_input),
                   p.grad_value_cache_input)};
  // The workspace is written too: an output of two 32-bit words (none without it).
  const std::array<Layout, 1> workspace{Layout{"workspace", p.workspace, 4, p.workspace ? kBackwardWorkspaceBytes / 4 : 0,
                                               1, {1, 1, 1}, {1, 0, 0}, {"workspace", nullptr, nullptr}}};
  if (reinterpret_cast<uintptr_t>(p.workspace) % 4 != 0) return fail(StatusCode::kMisaligned, "workspace");
  return check_tensors(concat(caches, common_inputs(p)), concat(concat(common_outputs(p), cache_grads), workspace));
}

//! Checks an in-place call: as for the out-of-place one, with gK and gV counted as outputs (they
//! are written), so they may overlap nothing else.
template <typename T, typename Pos>
Status validate(const BackwardInPlaceParams<T, Pos>& p) {
  using namespace detail;
  if (Status s = check_common_sizes(p); !s) return s;
  const std::array<Layout, 2> caches{
      cache_layout(p, "grad_key_cache", KVROPE_DETAIL_HEAD_STRIDES(grad_key_cache), p.grad_key_cache),
      cache_layout(p, "grad_value_cache", KVROPE_DETAIL_HEAD_STRIDES(grad_value_cache), p.grad_value_cache)};
  return check_tensors(common_inputs(p), concat(common_outputs(p), caches));
}

#undef KVROPE_DETAIL_HEAD_STRIDES
#undef KVROPE_DETAIL_TOKEN_STRIDES

namespace detail {
template <typename T, typename Pos>
BackwardArgs<T> args_of(const BackwardParams<T, Pos>& p) {
  BackwardArgs<T> a = make_args<T, Pos>(p, p.grad_key_cache, p.grad_value_cache, p.grad_key_cache_input,
                                        p.grad_value_cache_input, false);
  a.workspace = static_cast<unsigned int*>(p.workspace);
  return a;
}
template <typename T, typename Pos>
BackwardArgs<T> args_of(const BackwardInPlaceParams<T, Pos>& p) {
  return make_args<T, Pos>(p, p.grad_key_cache, p.grad_value_cache, p.grad_key_cache, p.grad_value_cache, true);
}
template <typename Params>
Status run_backward(const Params& params, const LaunchTuning* tuning, cudaStream_t stream, BackwardPlan* plan,
                    bool plan_only) {
  if (Status s = validate(params); !s) return s;
  return plan_and_launch(args_of(params), tuning, stream, plan, plan_only);
}
}  // namespace detail

//! Out-of-place backward (DESIGN.md section 1) in one kernel launch on `stream`. Validates first and
//! launches nothing when the parameters are invalid. Allocates nothing, does not synchronize and
//! reads no device memory on the host, so it may be captured in a CUDA graph.
//! Out-of-range positions are reported through params.error_flag (see read_error_flag).
//!
//! @param params  device pointers, sizes and strides
//! @param stream  the stream to launch on
//! @return        the first invalid field, a CUDA launch error, or success
template <typename T, typename Pos>
Status kv_cache_rope_backward(const BackwardParams<T, Pos>& params, cudaStream_t stream = nullptr) {
  return detail::run_backward(params, nullptr, stream, nullptr, false);
}

//! In-place backward: gK and gV are read, and their rows cache_position zeroed, in the same launch.
//! Repeated positions are handled (each token reads its row; the row is zeroed after the last read).
template <typename T, typename Pos>
Status kv_cache_rope_backward(const BackwardInPlaceParams<T, Pos>& params, cudaStream_t stream = nullptr) {
  return detail::run_backward(params, nullptr, stream, nullptr, false);
}

//! Either variant with explicit launch parameters instead of the device's default_tuning() (for
//! tuning studies).
template <typename Params>
Status kv_cache_rope_backward(const Params& params, const LaunchTuning& tuning, cudaStream_t stream = nullptr) {
  return detail::run_backward(params, &tuning, stream, nullptr, false);
}

//! Fills `plan` with what kv_cache_rope_backward would launch on the current device, launching
//! nothing (either variant).
template <typename Params>
Status plan_backward(const Params& params, BackwardPlan* plan) {
  return detail::run_backward(params, nullptr, nullptr, plan, true);
}

//! The plan of kv_cache_rope_backward(params, tuning).
template <typename Params>
Status plan_backward(const Params& params, const LaunchTuning& tuning, BackwardPlan* plan) {
  return detail::run_backward(params, &tuning, nullptr, plan, true);
}

//! Zeroes an error flag on `stream` (asynchronous; capturable).
inline Status reset_error_flag(int* flag, cudaStream_t stream = nullptr) {
  return detail::cuda_status(cudaMemsetAsync(flag, 0, sizeof(int), stream), "cudaMemsetAsync");
}

//! Zeroes a workspace (BackwardParams::workspace) on `stream`, once after allocating it: the
//! kernel leaves it zero after each call (asynchronous; capturable).
inline Status reset_workspace(void* workspace, cudaStream_t stream = nullptr) {
  return detail::cuda_status(cudaMemsetAsync(workspace, 0, kBackwardWorkspaceBytes, stream), "cudaMemsetAsync");
}

//! Reads an error flag written by earlier launches on `stream`. Synchronizes the stream, so call it
//! outside graph capture. Returns kPositionOutOfRange (field "cache_position") if a position was out
//! of range, success otherwise.
inline Status read_error_flag(const int* flag, cudaStream_t stream = nullptr) {
  int value = 0;
  if (Status s = detail::cuda_status(cudaMemcpyAsync(&value, flag, sizeof(int), cudaMemcpyDeviceToHost, stream),
                                     "cudaMemcpyAsync");
      !s)
    return s;
  if (Status s = detail::cuda_status(cudaStreamSynchronize(stream), "cudaStreamSynchronize"); !s) return s;
  if (value & kErrorPositionOutOfRange) return detail::fail(StatusCode::kPositionOutOfRange, "cache_position");
  return {};
}

}  // namespace kvrope
