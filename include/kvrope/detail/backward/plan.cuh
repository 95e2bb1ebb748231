// The planner: small pure functions from a call's shape, the launch policy and a few device facts to
// the launch (block, grid, shared memory, the kernel's arguments). No CUDA calls: tested on the host.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "../../backward_params.cuh"
#include "../common/alignment.cuh"
#include "args.cuh"
#include "fused/bulk_chunks.cuh"
#include "policy.cuh"

namespace kvrope::detail {

//! The full description of a launch: the public plan and the choices inside the kernel.
struct LaunchConfig {
  BackwardPlan plan;
  int token_warps = 0;             //!< fused, out of place: token warps a block (the others copy)
  int token_parts = 1;             //!< warps sharing one token (a power of two)
  int bulk_chunk_rows = 0;         //!< bulk copy: rows a chunk
  int bulk_speculated_chunks = 0;  //!< bulk copy: chunks a block loads before its bitmask
  bool token_zeros = false;        //!< the token warps write the zero rows
  bool token_prefetch = false;     //!< in place: rows prefetched into L2 ahead of their item
  int64_t bulk_shared_chunks = 0;  //!< bulk copy: chunks the blocks take by ticket from the workspace
};

//! What the planner needs to know of the device.
struct DeviceFacts {
  int sms = 0;
  int shared_optin = 0;    //!< the most dynamic shared memory a block may ask for
  bool sm90_code = false;  //!< the kernel instance has sm_90+ code (the bulk copy, the in-place prefetch)
};

//! Whether every row the call touches is 16-byte aligned and D / 2 whole vectors (the vector paths).
template <typename T>
bool vectorizable(const ProblemArgs<T>& a) {
  constexpr int kWide = 16 / sizeof(T);
  return a.head_dim % (2 * kWide) == 0 && aligned16(a.gk) && aligned16(a.gv) && aligned16(a.gk_out) &&
         aligned16(a.gv_out) && (!a.wants_tables() || aligned16(a.key)) && aligned16(a.cos) && aligned16(a.sin) &&
         aligned16(a.grad_key) && aligned16(a.grad_value) && aligned16(a.grad_cos) && aligned16(a.grad_sin);
}

//! The kernels' view of a call (both variants): gk_out / gv_out are new buffers or gk / gv themselves.
template <typename T, typename Pos>
ProblemArgs<T> problem_args(const BackwardCommon<T, Pos>& p, HeadRows<const T> gk, HeadRows<const T> gv,
                            HeadRows<T> gk_out, HeadRows<T> gv_out, bool in_place) {
  ProblemArgs<T> a{};
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
  a.div_seq = FastDivmod(static_cast<uint32_t>(std::max<int64_t>(p.seq_len, 1)));
  a.div_heads = FastDivmod(static_cast<uint32_t>(std::max<int64_t>(p.heads, 1)));
  return a;
}

//! The kernels' view of an out-of-place call.
template <typename T, typename Pos>
ProblemArgs<T> problem_args(const BackwardParams<T, Pos>& p) {
  return problem_args<T, Pos>(p, p.grad_key_cache, p.grad_value_cache, p.grad_key_cache_input, p.grad_value_cache_input,
                              false);
}
//! The kernels' view of an in-place call: gK and gV are their own outputs.
template <typename T, typename Pos>
ProblemArgs<T> problem_args(const BackwardInPlaceParams<T, Pos>& p) {
  return problem_args<T, Pos>(p, p.grad_key_cache, p.grad_value_cache, p.grad_key_cache, p.grad_value_cache, true);
}

//! Whether a params type is the in-place variant.
template <typename Params>
inline constexpr bool kIsInPlace = false;
template <typename T, typename Pos>
inline constexpr bool kIsInPlace<BackwardInPlaceParams<T, Pos>> = true;

template <typename T, typename Pos>
unsigned int* workspace_of(const BackwardParams<T, Pos>& p) {
  return static_cast<unsigned int*>(p.workspace);
}
template <typename T, typename Pos>
unsigned int* workspace_of(const BackwardInPlaceParams<T, Pos>&) {
  return nullptr;
}

//! A call's rotation besides the default (rotate-half, R = D, table gradients per batch).
struct RotarySpec {
  int64_t rotary_dim = 0;  // R (0: D)
  RotaryStyle style = RotaryStyle::kRotateHalf;
  bool sum_batches = false;  // table gradients of batch stride 0 with B > 1: summed over the batch

  //! Whether the call takes the general instance of the fused kernel.
  bool general(int64_t head_dim) const {
    return style != RotaryStyle::kRotateHalf || effective_rotary_dim(rotary_dim, head_dim) != head_dim || sum_batches;
  }
};

template <typename T, typename Pos>
RotarySpec rotary_spec(const BackwardCommon<T, Pos>& p) {
  const bool shared =
      (p.grad_cos.data && p.grad_cos.batch_stride == 0) || (p.grad_sin.data && p.grad_sin.batch_stride == 0);
  return RotarySpec{p.rotary_dim, p.style, shared && p.batch > 1};
}

//! Which instance a call takes: a compiled head dim (`instance` > 0) needs 16-byte rows.
inline BackwardPath backward_path(bool vec, int instance) {
  return !vec           ? BackwardPath::kGenericScalar
         : instance > 0 ? BackwardPath::kCompiledHeadDim
                        : BackwardPath::kGenericVectorized;
}

//! log2 of the warps sharing a token: as many as `token_warps` allow for `tokens`, up to the most that
//! leave every lane a head row chunk, at most 8 (fewer dependent steps a lane).
inline int token_parts_log2(int64_t tokens, int64_t token_warps, int64_t heads, int64_t head_dim, int token_vec) {
  const int64_t pairs = head_dim / 2 / token_vec;
  int64_t slots = 1;
  while (slots < 32 && slots < heads) slots *= 2;
  int log2 = 0;
  while (log2 < 3 && pairs * slots >= (int64_t{64} << log2) && tokens * (int64_t{2} << log2) <= token_warps) ++log2;
  return log2;
}

//! The decode kernel's 16-byte chunks of half a row.
template <typename T>
constexpr int64_t decode_half_chunks(int64_t head_dim) {
  return head_dim / 2 / (16 / int64_t{sizeof(T)});
}

//! The decode kernel's warps a token: a power of two, at most kDecodeMaxTokenWarps and the chunks of
//! half a row; doubled while the warps still cover no more heads a pass than the token has, and out of
//! place doubled once more (its warps share the SM with the copy). H = 8, D = 128, 16-bit: 2 in place,
//! 4 out of place, case 8 5-7 % faster than with one.
template <typename T>
int decode_token_warps(int64_t heads, int64_t head_dim, bool in_place) {
  const int64_t chunks = decode_half_chunks<T>(head_dim);
  const int64_t most = std::min<int64_t>(chunks, kDecodeMaxTokenWarps);
  int warps = 1;
  while (warps * 2 <= most && 32 * warps * 2 / chunks <= heads) warps *= 2;
  if (!in_place && warps * 2 <= most) warps *= 2;
  return warps;
}

//! Whether the call takes the decode kernel: S = 1 on the vector path with a head dim it has, in place
//! always, out of place when the caches fit decode_copy_max_mib and 32-bit vector indices.
template <typename T>
bool takes_decode(const ProblemArgs<T>& a, const LaunchPolicy& policy, bool vec) {
  // (H = 0 keeps the fused kernel: its tables may then be null, and the decode kernel reads them first.)
  if (a.seq_len != 1 || a.heads == 0 || !vec || !decode_head_dim_ok<T>(a.head_dim)) return false;
  if (a.in_place) return true;
  const int64_t copy_elems = 2 * a.batch * a.heads * a.cache_len * a.head_dim;
  const int64_t cache_bytes = copy_elems * int64_t{sizeof(T)};
  return a.cache_len > 0 && copy_elems / 2 / (16 / int64_t{sizeof(T)}) < (int64_t{1} << 31) &&
         cache_bytes <= (int64_t{std::max(policy.decode_copy_max_mib, 0)} << 20);
}

//! The decode kernel's block: a token's warps in place; out of place at least one more warp, which copies.
template <typename T>
int decode_block(const ProblemArgs<T>& a, const LaunchPolicy& policy) {
  const int token_warps = decode_token_warps<T>(a.heads, a.head_dim, a.in_place);
  return a.in_place ? 32 * token_warps
                    : std::clamp(policy.decode_block_threads / 32 * 32, 32 * (token_warps + 1), kDecodeMaxBlockThreads);
}

//! The decode launch, given the block and `resident` blocks a SM: as many blocks as the copy can use
//! (kDecodeCopyPairs vector pairs a thread a round), at least one a batch, one wave at most.
template <typename T>
DecodeArgs<T> plan_decode(const ProblemArgs<T>& a, int block, int sms, int resident, LaunchConfig& config) {
  constexpr int kWide = 16 / sizeof(T);
  const int token_warps = decode_token_warps<T>(a.heads, a.head_dim, a.in_place);
  const int64_t grid_max = int64_t{sms} * std::max(1, resident);
  const int64_t vectors = a.in_place ? 0 : 2 * a.batch * a.heads * a.cache_len * a.head_dim / kWide;
  const int64_t per_block = int64_t{block} * 2 * kDecodeCopyPairs;
  const int64_t copy_blocks = (vectors + per_block - 1) / per_block;
  BackwardPlan& plan = config.plan;
  plan.kernel = BackwardKernel::kDecode;
  plan.vec_width = kWide;
  plan.block = block;
  plan.shared_bytes = 0;  // (its position slots are static shared memory)
  plan.grid = static_cast<int>(std::clamp<int64_t>(std::max(copy_blocks, a.batch), 1, grid_max));
  config.token_warps = a.in_place ? 0 : token_warps;
  config.token_parts = token_warps;
  DecodeArgs<T> args{};
  static_cast<ProblemArgs<T>&>(args) = a;
  args.token_blocks = std::min<int64_t>(a.batch, plan.grid);
  args.token_warps = token_warps;
  args.slab_vecs = FastDivmod(static_cast<uint32_t>(std::max<int64_t>(1, a.cache_len * a.head_dim / kWide)));
  return args;
}

//! The fused kernel's block, bitmask window, bulk-copy ring and shared memory (before the grid, which
//! needs the occupancy these give).
template <typename T>
FusedArgs<T> plan_fused_block(const ProblemArgs<T>& a, const RotarySpec& rotary, const LaunchPolicy& policy,
                              const DeviceFacts& device, bool vec, LaunchConfig& config) {
  FusedArgs<T> f{};
  static_cast<ProblemArgs<T>&>(f) = a;
  const int64_t rows = std::max<int64_t>(a.cache_len, 1);
  f.window_rows = std::min<int64_t>((rows + 31) / 32 * 32, kMaxWindowRows);
  f.windows = a.cache_len == 0 ? 1 : (a.cache_len + f.window_rows - 1) / f.window_rows;
  BackwardPlan& plan = config.plan;
  plan.kernel = BackwardKernel::kFused;
  plan.vec_width = vec ? int{16 / sizeof(T)} : 1;
  plan.block = std::clamp(policy.block_threads / 32 * 32, 64, kMaxBlockThreads);  // two roles: two warps at least
  // The ring: as many stages as the policy asks that fit a block's shared memory (all 6 on H100-B200).
  const int64_t row_bytes = a.head_dim * int64_t{sizeof(T)};
  const int64_t ring_offset = bulk_ring_offset(mask_bytes(f.window_rows));
  const int fitting = static_cast<int>(std::max<int64_t>(0, (device.shared_optin - ring_offset) / bulk_ring_bytes(1)));
  f.bulk_stages = std::min(std::clamp(policy.bulk_stages, 2, kMaxBulkStages), fitting);
  f.bulk_slack = std::clamp(policy.bulk_store_slack, 1, std::max(1, std::min(f.bulk_stages - 1, kMaxBulkSlack)));
  const int64_t copy_elems = a.in_place ? 0 : 2 * a.batch * a.heads * a.cache_len * a.head_dim;
  f.bulk = policy.bulk_copy && vec && !a.in_place && copy_elems > 0 && device.sm90_code &&
           row_bytes <= kBulkStageBytes && f.bulk_stages >= 2;
  plan.bulk_copy = f.bulk;
  plan.shared_bytes =
      static_cast<int>(f.bulk ? ring_offset + bulk_ring_bytes(f.bulk_stages) : mask_bytes(f.window_rows));
  f.token_prefetch = a.in_place && device.sm90_code && vec;  // measured on sm_90 only (in place 1.7 % faster)
  config.token_prefetch = f.token_prefetch;
  f.rotary_dim = effective_rotary_dim(rotary.rotary_dim, a.head_dim);
  f.style = rotary.style;
  f.rotary_units = static_cast<int>(f.rotary_dim / (2 * std::min(plan.vec_width, kTokenVecMax)));
  f.sum_batches = rotary.sum_batches;
  return f;
}

//! The fused kernel's grid and the split of its warps, given `resident` blocks a SM.
template <typename T>
void plan_fused_grid(FusedArgs<T>& f, const LaunchPolicy& policy, int sms, int resident, unsigned int* workspace,
                     LaunchConfig& config) {
  BackwardPlan& plan = config.plan;
  const int64_t tokens = f.sum_batches ? f.seq_len : f.batch * f.seq_len;
  const int64_t copy_elems = f.in_place ? 0 : 2 * f.batch * f.heads * f.cache_len * f.head_dim;
  const int64_t grid_max = int64_t{sms} * std::max(1, std::min(policy.blocks_per_sm, resident));  // one wave
  const int64_t warps = plan.block / 32;
  const int token_vec = std::min(plan.vec_width, kTokenVecMax);
  auto parts_log2_for = [&](int64_t warps_total) {
    const int64_t split = f.in_place ? std::min<int64_t>(warps_total, kInPlaceSplitWarpsPerSm * sms) : warps_total;
    return token_parts_log2(tokens, split, f.heads, f.head_dim, token_vec);
  };
  // Token work with no copy beside it (in place, or no cache rows): the blocks its items need.
  const int64_t lone_parts = int64_t{1} << parts_log2_for(grid_max * warps);
  const int64_t token_blocks_max = (tokens * lone_parts + warps - 1) / warps;
  int64_t grid = grid_max;
  bool small_cache = false;
  if (f.bulk) {
    f.token_warps = static_cast<int>(warps - 1);  // one copy warp a block
    // Small caches: chunks halved (down to 4 KiB) until every block has bulk_min_chunks_per_block.
    const int64_t row_bytes = f.head_dim * int64_t{sizeof(T)};
    const int64_t chunk_bytes = std::clamp<int64_t>(policy.bulk_chunk_bytes, kMinBulkChunkBytes, kBulkStageBytes);
    f.bulk_chunk_rows = static_cast<int>(std::max<int64_t>(1, chunk_bytes / row_bytes));
    const RowWindow first = row_window(f, 0);
    BulkWindow chunked = bulk_window(f, first);
    while (chunked.total < int64_t{policy.bulk_min_chunks_per_block} * grid_max && f.bulk_chunk_rows % 2 == 0 &&
           f.bulk_chunk_rows * row_bytes >= 2 * kMinBulkChunkBytes) {
      f.bulk_chunk_rows /= 2;
      chunked = bulk_window(f, first);
    }
    const int64_t chunks = chunked.total;
    // The same chunks a slab, their rows spread evenly: no short last chunk (D = 80 or 96 at 2048 rows:
    // 10.04 and 12.05 chunks of 32 KiB).
    f.bulk_chunk_rows = static_cast<int>((first.wlen + chunked.per_slab - 1) / chunked.per_slab);
    const int64_t token_blocks = (tokens + f.token_warps - 1) / f.token_warps;
    grid = std::clamp<int64_t>(std::max(chunks, token_blocks), 1, grid_max);
    // The first chunks load before the bitmask when its positions load in few rounds (a later round
    // would queue behind them: case 9's bitmask came at ~12 us).
    small_cache = chunks <= kSpeculateChunksPerBlock * grid;
    const int64_t mask_round = int64_t{kMaskLoads} * 32 * f.token_warps;
    if (f.seq_len <= mask_round * std::max(1, policy.bulk_speculate_mask_rounds))
      f.bulk_speculate = std::clamp(policy.bulk_speculate_chunks, 0, f.bulk_stages);
  } else if (f.in_place) {
    grid = std::clamp<int64_t>(tokens * lone_parts, 1, grid_max);  // a block an item, up to a wave (5 % faster)
  } else if (tokens == 0) {
    const int64_t copy_blocks =
        (copy_elems / plan.vec_width + int64_t{plan.block} * kCopyUnroll - 1) / (int64_t{plan.block} * kCopyUnroll);
    grid = std::clamp<int64_t>(copy_blocks, 1, grid_max);
  } else if (copy_elems == 0) {
    f.token_warps = static_cast<int>(warps);
    grid = std::clamp<int64_t>(token_blocks_max, 1, grid_max);
  } else {
    // The register copy: each block's warps split between the roles by the bytes each moves.
    const double token_bytes = double(tokens) * double(f.head_dim) * (5.0 * double(f.heads) + 4.0);
    const double copy_bytes = 2.0 * double(copy_elems);
    const double share = token_bytes / (token_bytes + policy.token_warp_weight * copy_bytes);
    f.token_warps = static_cast<int>(std::clamp<int64_t>(std::llround(double(warps) * share), 1, warps - 1));
    const int64_t copy_threads = (warps - f.token_warps) * 32;
    const int64_t copy_blocks =
        (copy_elems / plan.vec_width + copy_threads * kCopyUnroll - 1) / (copy_threads * kCopyUnroll);
    const int64_t token_blocks = (tokens + f.token_warps - 1) / f.token_warps;
    grid = std::clamp<int64_t>(std::max(copy_blocks, token_blocks), 1, grid_max);
  }
  plan.grid = static_cast<int>(grid);
  f.token_parts_log2 = parts_log2_for(grid * (f.in_place ? warps : f.token_warps));
  f.token_zeros = f.bulk_speculate > 0 && small_cache;
  f.workspace = nullptr;
  if (f.bulk) {
    f.bulk_first = bulk_window(f, row_window(f, 0));
    f.bulk_per_block = bulk_chunks_per_block(f.bulk_first.total, grid);
    // A large cache and a workspace: each block copies its first ring's worth, then takes tickets.
    const int64_t total = f.bulk_first.total;
    const int64_t fixed = std::min<int64_t>(f.bulk_per_block, f.bulk_stages);
    const int64_t shared_chunks = total - fixed * grid;
    if (workspace != nullptr && f.windows == 1 && total > int64_t{policy.bulk_share_min_chunks_per_block} * grid &&
        shared_chunks > 0 && shared_chunks < (int64_t{1} << 31)) {
      f.bulk_per_block = fixed;
      f.share_chunks = true;
      f.workspace = workspace;
      config.bulk_shared_chunks = shared_chunks;
    }
  }
  config.token_warps = f.token_warps;
  config.token_parts = 1 << f.token_parts_log2;
  config.bulk_chunk_rows = f.bulk_chunk_rows;
  config.bulk_speculated_chunks = f.bulk_speculate;
  config.token_zeros = f.token_zeros;
}

}  // namespace kvrope::detail
