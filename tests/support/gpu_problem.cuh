// GPU test fixtures: random device tensors in BHSD or BSHD layout, NaN-poisoned outputs, the three
// implementations (fused out-of-place, fused in-place, naive), and the float64 check of what they wrote.
#pragma once

#include <kvrope/kvrope.cuh>
#include <kvrope/reference/cpu_backward.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "verify/naive/naive_backward.cuh"
#include "support/catch.hpp"
#include "support/cuda_require.hpp"
#include "verify/check_backward.hpp"
#include "verify/launch_policy.cuh"
#include "verify/launchers.cuh"

namespace kvrope::testing {

//! The integer in environment variable `name`, or `fallback` when it is unset or empty.
inline int64_t env_int(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoll(v, nullptr, 10) : fallback;
}

//! A random test's run: KVROPE_RANDOM_CONFIGS configurations (default 300) drawn from KVROPE_RANDOM_SEED
//! (default `seed`), printed first (`what`: "append", ...) so that a failure can be drawn again.
struct RandomRun {
  int64_t configs;
  uint64_t seed;
  //! Configuration i's own seed.
  uint64_t config_seed(int64_t i) const { return seed * 1000003u + static_cast<uint64_t>(i); }
  //! Where configuration i stands, for its INFO: "run seed S, configuration i of N".
  std::string where(int64_t i) const {
    return "run seed " + std::to_string(seed) + ", configuration " + std::to_string(i) + " of " +
           std::to_string(configs);
  }
};

//! The element types a random test draws, by number: 0 bf16, 1 fp16, else fp32.
inline const char* dtype_name(int dtype) { return dtype == 0 ? "bf16" : dtype == 1 ? "fp16" : "fp32"; }
//! Calls f with a value of the element type `dtype` names (dtype_name).
template <typename F>
void with_dtype(int dtype, F&& f) {
  if (dtype == 0)
    f(__nv_bfloat16{});
  else if (dtype == 1)
    f(__half{});
  else
    f(float{});
}
inline RandomRun random_run(const char* what, uint64_t seed) {
  const RandomRun r{env_int("KVROPE_RANDOM_CONFIGS", 300),
                    static_cast<uint64_t>(env_int("KVROPE_RANDOM_SEED", static_cast<int64_t>(seed)))};
  std::printf("random %s configurations: %lld, seed %llu (KVROPE_RANDOM_CONFIGS, KVROPE_RANDOM_SEED)\n", what,
              static_cast<long long>(r.configs), static_cast<unsigned long long>(r.seed));
  return r;
}

//! Owns a device allocation of `count` elements of T.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t count) : count_(count) {
    if (count_) KVROPE_CUDA_REQUIRE(cudaMalloc(&ptr_, count_ * sizeof(T)));
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(count_, o.count_);
    return *this;
  }
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  T* get() const { return ptr_; }
  size_t size() const { return count_; }
  std::vector<T> to_host() const {
    std::vector<T> h(count_);
    if (count_) KVROPE_CUDA_REQUIRE(cudaMemcpy(h.data(), ptr_, count_ * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }

 private:
  T* ptr_ = nullptr;
  size_t count_ = 0;
};

// Standard normal numbers from a counter hash (element i depends only on the seed and i), never
// exactly zero in T.
template <typename T>
__host__ __device__ inline T normal_at(uint64_t seed, size_t i) {
  uint64_t x = seed ^ (i * 0x9E3779B97F4A7C15ull);
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 33;
  const float u1 = (static_cast<float>(x >> 40) + 0.5f) * (1.0f / 16777216.0f);
  const float u2 = static_cast<float>((x >> 16) & 0xFFFFFF) * (1.0f / 16777216.0f);
  float z = sqrtf(-2.0f * logf(u1)) * cosf(6.28318530718f * u2);
  if (to_float(from_float<T>(z)) == 0.0f) z = 0.5f;
  return from_float<T>(z);
}

template <typename T>
__global__ void fill_normal(T* out, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x)
    out[i] = normal_at<T>(seed, i);
}

//! Fills a buffer with random normal numbers: on the host for small buffers (one copy instead of a
//! launch, which keeps the GPU tests quick under compute-sanitizer), on the device for large ones.
template <typename T>
void fill_random(DeviceBuffer<T>& buf, uint64_t seed) {
  if (buf.size() == 0) return;
  if (buf.size() <= (size_t{1} << 20)) {
    std::vector<T> host(buf.size());
    for (size_t i = 0; i < host.size(); ++i) host[i] = normal_at<T>(seed, i);
    KVROPE_CUDA_REQUIRE(cudaMemcpy(buf.get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
    return;
  }
  fill_normal<<<1024, 256>>>(buf.get(), buf.size(), seed);
  KVROPE_CUDA_REQUIRE(cudaGetLastError());
}

//! Fills with 0xFF bytes: NaN in bf16, fp16 and fp32, so an unwritten output element is caught.
template <typename T>
void poison(DeviceBuffer<T>& buf) {
  if (buf.size()) KVROPE_CUDA_REQUIRE(cudaMemset(buf.get(), 0xFF, buf.size() * sizeof(T)));
}

enum class Layout { kBHSD, kBSHD };
enum class Positions { kArange, kPermutation, kSparse, kNegative, kDuplicates, kOutOfRange, kWrap };
enum class Variant { kOutOfPlace, kInPlace, kNaive, kOutOfPlaceNoTables, kInPlaceNoTables };

inline const char* name(Layout l) { return l == Layout::kBHSD ? "BHSD" : "BSHD"; }
inline const char* name(Positions p) {
  const char* names[] = {"arange", "permutation", "sparse", "negative", "duplicates", "out_of_range", "wrap"};
  return names[static_cast<int>(p)];
}
inline const char* name(Variant v) {
  const char* names[] = {"out_of_place", "in_place", "naive", "out_of_place_no_tables", "in_place_no_tables"};
  return names[static_cast<int>(v)];
}

struct Shape {
  int64_t batch, heads, seq_len, cache_len, head_dim;
};

struct Config {
  Shape shape;
  Layout layout = Layout::kBHSD;
  Positions positions = Positions::kArange;
  Variant variant = Variant::kOutOfPlace;
  bool broadcast_tables = false;
  uint64_t seed = 1;
  // Arbitrary strides: extra elements after each row, head block and batch of every tensor, and a
  // pointer offset (in elements) that breaks 16-byte alignment when odd.
  int64_t pad_row = 0, pad_head = 0, pad_batch = 0, offset = 0;
  // The rotation: rotary_dim R (0: D), the style, and table gradients summed over the batch.
  int64_t rotary_dim = 0;
  RotaryStyle style = RotaryStyle::kRotateHalf;
  bool sum_table_grads = false;

  std::string describe() const {
    std::ostringstream os;
    os << "B=" << shape.batch << " H=" << shape.heads << " S=" << shape.seq_len << " S_max=" << shape.cache_len
       << " D=" << shape.head_dim << " " << name(layout) << " positions=" << name(positions)
       << " variant=" << name(variant) << (broadcast_tables ? " broadcast_tables" : "") << " seed=" << seed;
    if (pad_row || pad_head || pad_batch || offset)
      os << " pad=" << pad_row << "/" << pad_head << "/" << pad_batch << " offset=" << offset;
    if (rotary_dim || style != RotaryStyle::kRotateHalf || sum_table_grads)
      os << " R=" << rotary_dim << (style == RotaryStyle::kInterleaved ? " interleaved" : " rotate-half")
         << (sum_table_grads ? " summed_table_grads" : "");
    return os.str();
  }
};

//! cache_position values for a pattern (S <= S_max where the pattern needs distinct rows).
template <typename Pos>
std::vector<Pos> make_positions(Positions pattern, int64_t S, int64_t L, std::mt19937_64& rng) {
  std::vector<int64_t> p(static_cast<size_t>(S));
  std::vector<int64_t> rows(static_cast<size_t>(L));
  std::iota(rows.begin(), rows.end(), 0);
  switch (pattern) {
    case Positions::kArange: std::iota(p.begin(), p.end(), 0); break;
    case Positions::kPermutation:
      std::shuffle(rows.begin(), rows.end(), rng);
      std::copy_n(rows.begin(), S, p.begin());
      break;
    case Positions::kSparse:
      std::shuffle(rows.begin(), rows.end(), rng);
      std::copy_n(rows.begin(), S, p.begin());
      std::sort(p.begin(), p.end());
      break;
    case Positions::kNegative:
      std::shuffle(rows.begin(), rows.end(), rng);
      for (int64_t t = 0; t < S; ++t) p[t] = (t % 2 == 0) ? rows[t] - L : rows[t];
      break;
    case Positions::kDuplicates:
      for (int64_t t = 0; t < S; ++t) p[t] = static_cast<int64_t>(rng() % std::max<int64_t>(1, (S + 1) / 2)) % L;
      if (S > 1) p[S - 1] = p[0] - L;  // the same row written as a negative position
      break;
    case Positions::kOutOfRange:
      std::iota(p.begin(), p.end(), 0);
      if (S > 0) p[S / 2] = L;
      if (S > 2) p[S / 3] = -L - 1;
      break;
    case Positions::kWrap:  // one run of rows that wraps past the cache's end, odd tokens as negatives
      for (int64_t t = 0; t < S; ++t) p[t] = (L - S / 2 + t) % L - (t % 2 ? L : 0);
      break;
  }
  return std::vector<Pos>(p.begin(), p.end());
}

using experimental::LaunchConfig;
using experimental::LaunchPolicy;

//! The device's own launch policy, to change a field of (tests of paths the default does not take).
inline LaunchPolicy device_policy() {
  int device = 0, major = 0;
  KVROPE_CUDA_REQUIRE(cudaGetDevice(&device));
  KVROPE_CUDA_REQUIRE(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  return experimental::default_policy(major);
}

//! A whole problem on the device: inputs, NaN-poisoned outputs, and host copies for the check.
template <typename T, typename Pos>
struct Problem {
  Config cfg;
  DeviceBuffer<T> gk, gv, key, cos, sin, gks, gvs, gcos, gsin, gk_in, gv_in;
  DeviceBuffer<Pos> pos;
  DeviceBuffer<int> flag;
  DeviceBuffer<char> workspace;    // the naive reference's temporaries
  DeviceBuffer<unsigned> tickets;  // BackwardParams::workspace: zeroed once, left zero by every call
  bool use_workspace = true;       // out-of-place calls get `tickets` as their workspace
  std::vector<Pos> host_pos;

  explicit Problem(const Config& c) : cfg(c) {
    const Shape& s = c.shape;
    const size_t cache = heads_span(s.cache_len);
    const size_t tok = heads_span(s.seq_len);
    const size_t tab = table_span(c.broadcast_tables);
    const size_t tab_out = table_span(c.sum_table_grads);
    gk = DeviceBuffer<T>(cache);
    gv = DeviceBuffer<T>(cache);
    key = DeviceBuffer<T>(tok);
    cos = DeviceBuffer<T>(tab);
    sin = DeviceBuffer<T>(tab);
    gks = DeviceBuffer<T>(tok);
    gvs = DeviceBuffer<T>(tok);
    gcos = DeviceBuffer<T>(tab_out);
    gsin = DeviceBuffer<T>(tab_out);
    gk_in = DeviceBuffer<T>(cache);
    gv_in = DeviceBuffer<T>(cache);
    pos = DeviceBuffer<Pos>(s.seq_len);
    flag = DeviceBuffer<int>(1);
    tickets = DeviceBuffer<unsigned>(kBackwardWorkspaceBytes / sizeof(unsigned));
    KVROPE_CUDA_REQUIRE(cudaMemset(tickets.get(), 0, kBackwardWorkspaceBytes));
    uint64_t seed = c.seed * 1000003u;
    for (DeviceBuffer<T>* b : {&gk, &gv, &key, &cos, &sin}) fill_random(*b, ++seed);
    std::mt19937_64 rng(c.seed);
    host_pos = make_positions<Pos>(c.positions, s.seq_len, s.cache_len, rng);
    if (s.seq_len)
      KVROPE_CUDA_REQUIRE(cudaMemcpy(pos.get(), host_pos.data(), s.seq_len * sizeof(Pos), cudaMemcpyHostToDevice));
  }

  // [B, H, len, D] with the configured layout and padding, starting `offset` elements into `data`.
  HeadRows<T> heads_view(T* data, int64_t len) const {
    const Shape& s = cfg.shape;
    const int64_t row = s.head_dim + cfg.pad_row;
    HeadRows<T> v{data ? data + cfg.offset : nullptr, 0, 0, 0};
    if (cfg.layout == Layout::kBHSD) {
      v.seq_stride = row;
      v.head_stride = len * row + cfg.pad_head;
      v.batch_stride = s.heads * v.head_stride + cfg.pad_batch;
    } else {
      v.head_stride = row;
      v.seq_stride = s.heads * row + cfg.pad_head;
      v.batch_stride = len * v.seq_stride + cfg.pad_batch;
    }
    return v;
  }
  size_t heads_span(int64_t len) const {
    const HeadRows<T> v = heads_view(nullptr, len);
    return static_cast<size_t>(cfg.offset + cfg.shape.batch * v.batch_stride);
  }
  TokenRows<T> table_view(T* data, bool broadcast) const {
    const int64_t row = effective_rotary_dim(cfg.rotary_dim, cfg.shape.head_dim) + cfg.pad_row;
    const int64_t batch_stride = broadcast ? 0 : cfg.shape.seq_len * row + cfg.pad_batch;
    return {data ? data + cfg.offset : nullptr, batch_stride, row};
  }
  size_t table_span(bool broadcast) const {
    const TokenRows<T> v = table_view(nullptr, broadcast);
    const int64_t batches = broadcast ? 1 : cfg.shape.batch;
    return static_cast<size_t>(cfg.offset + batches * (cfg.shape.seq_len * v.seq_stride + cfg.pad_batch));
  }
  TokenRows<T> table_view(T* data) const { return table_view(data, cfg.broadcast_tables); }
  TokenRows<T> out_table_view(T* data) const { return table_view(data, cfg.sum_table_grads); }

  bool tables() const {
    return cfg.variant != Variant::kOutOfPlaceNoTables && cfg.variant != Variant::kInPlaceNoTables;
  }

  // Params over the given base pointers (device buffers or their host copies).
  template <typename P>
  void fill_common(P& p, T* gk_, T* gv_, T* key_, T* cos_, T* sin_, T* gks_, T* gvs_, T* gcos_, T* gsin_,
                   Pos* pos_) const {
    const Shape& s = cfg.shape;
    p.batch = s.batch;
    p.heads = s.heads;
    p.seq_len = s.seq_len;
    p.cache_len = s.cache_len;
    p.head_dim = s.head_dim;
    p.rotary_dim = cfg.rotary_dim;
    p.style = cfg.style;
    p.key_states = tables() ? heads_view(key_, s.seq_len) : HeadRows<T>{};  // not read without tables
    p.cos = table_view(cos_);
    p.sin = table_view(sin_);
    p.cache_position = pos_;
    p.grad_key_states = heads_view(gks_, s.seq_len);
    p.grad_value_states = heads_view(gvs_, s.seq_len);
    p.grad_cos = tables() ? out_table_view(gcos_) : TokenRows<T>{};
    p.grad_sin = tables() ? out_table_view(gsin_) : TokenRows<T>{};
    p.grad_key_cache = heads_view(gk_, s.cache_len);
    p.grad_value_cache = heads_view(gv_, s.cache_len);
  }

  BackwardParams<T, Pos> device_params() {
    BackwardParams<T, Pos> p;
    fill_common(p, gk.get(), gv.get(), key.get(), cos.get(), sin.get(), gks.get(), gvs.get(), gcos.get(), gsin.get(),
                pos.get());
    p.grad_key_cache_input = heads_view(gk_in.get(), cfg.shape.cache_len);
    p.grad_value_cache_input = heads_view(gv_in.get(), cfg.shape.cache_len);
    p.error_flag = flag.get();
    p.workspace = use_workspace ? tickets.get() : nullptr;
    return p;
  }
  BackwardInPlaceParams<T, Pos> device_inplace_params() {
    BackwardInPlaceParams<T, Pos> p;
    fill_common(p, gk.get(), gv.get(), key.get(), cos.get(), sin.get(), gks.get(), gvs.get(), gcos.get(), gsin.get(),
                pos.get());
    p.error_flag = flag.get();
    return p;
  }

  void poison_outputs() {
    for (DeviceBuffer<T>* b : {&gks, &gvs, &gcos, &gsin, &gk_in, &gv_in}) poison(*b);
    KVROPE_CUDA_REQUIRE(cudaMemset(flag.get(), 0, sizeof(int)));
  }

  bool in_place() const { return cfg.variant == Variant::kInPlace || cfg.variant == Variant::kInPlaceNoTables; }

  //! Launches the configured implementation on `stream` (no synchronization), with `policy` when
  //! given instead of the device's own (the fused variants, through the experimental header).
  Status launch(cudaStream_t stream = nullptr, const LaunchPolicy* policy = nullptr) {
    using L = Launchers<T, Pos>;
    if (in_place())
      return policy ? L::backward(device_inplace_params(), *policy, stream)
                    : L::backward(device_inplace_params(), stream);
    if (cfg.variant == Variant::kNaive) {
      auto p = device_params();
      workspace = DeviceBuffer<char>(reference::naive_backward_workspace_bytes(p));
      return reference::naive_backward(p, workspace.get(), workspace.size(), stream);
    }
    return policy ? L::backward(device_params(), *policy, stream) : L::backward(device_params(), stream);
  }

  //! The public plan of launch(stream) (the fused variants; the naive reference has no plan).
  Status plan(BackwardPlan* out) {
    using L = Launchers<T, Pos>;
    return in_place() ? L::plan(device_inplace_params(), out) : L::plan(device_params(), out);
  }
  //! The full launch of launch(stream, policy).
  Status plan(LaunchConfig* out, const LaunchPolicy* policy) {
    using L = Launchers<T, Pos>;
    return in_place() ? L::plan(device_inplace_params(), policy, out) : L::plan(device_params(), policy, out);
  }

  //! Runs the configured implementation once (with `policy` when given) and checks everything it
  //! wrote against float64.
  void run_and_check(const LaunchPolicy* policy = nullptr) {
    launch_and_check([&] {
      const Status st = launch(nullptr, policy);
      INFO("status " << to_string(st.code) << " field " << (st.field ? st.field : "-"));
      REQUIRE(st.ok());
    });
  }

  //! Poisons the outputs, snapshots the inputs, calls `run` (which must launch this problem's op
  //! on any stream), synchronizes and checks every output against float64.
  template <typename Run>
  void launch_and_check(Run&& run) {
    INFO(cfg.describe());
    poison_outputs();
    KVROPE_CUDA_REQUIRE(cudaDeviceSynchronize());
    // Host copies of the inputs, taken before the call (the in-place variant overwrites gK, gV).
    std::vector<T> h_gk = gk.to_host(), h_gv = gv.to_host(), h_key = key.to_host(), h_cos = cos.to_host(),
                   h_sin = sin.to_host();
    run();
    KVROPE_CUDA_REQUIRE(cudaGetLastError());
    KVROPE_CUDA_REQUIRE(cudaDeviceSynchronize());
    check(h_gk, h_gv, h_key, h_cos, h_sin);
  }

  //! Checks the outputs now on the device against float64 results from the given input copies.
  void check(std::vector<T>& h_gk, std::vector<T>& h_gv, std::vector<T>& h_key, std::vector<T>& h_cos,
             std::vector<T>& h_sin) {
    INFO(cfg.describe());
    const bool in_place = this->in_place();
    std::vector<T> h_gks = gks.to_host(), h_gvs = gvs.to_host(), h_gcos = gcos.to_host(), h_gsin = gsin.to_host();
    std::vector<T> h_gk_in = in_place ? gk.to_host() : gk_in.to_host();
    std::vector<T> h_gv_in = in_place ? gv.to_host() : gv_in.to_host();

    BackwardParams<T, Pos> in;
    fill_common(in, h_gk.data(), h_gv.data(), h_key.data(), h_cos.data(), h_sin.data(), nullptr, nullptr, nullptr,
                nullptr, host_pos.data());
    verify::BackwardOutputs<T> out;
    out.grad_key_states = heads_view(h_gks.data(), cfg.shape.seq_len);
    out.grad_value_states = heads_view(h_gvs.data(), cfg.shape.seq_len);
    out.grad_key_cache_input = heads_view(h_gk_in.data(), cfg.shape.cache_len);
    out.grad_value_cache_input = heads_view(h_gv_in.data(), cfg.shape.cache_len);
    if (tables()) {
      out.grad_cos = out_table_view(h_gcos.data());
      out.grad_sin = out_table_view(h_gsin.data());
    }
    const verify::CheckResult r = verify::check_backward(in, out);
    INFO("checked " << r.checked << ", mismatches " << r.mismatches << ": " << r.first_mismatch);
    CHECK(r.ok());

    // Out-of-range positions, and only they, raise the error flag (B = 0 reads no position).
    const Status flag_status = read_error_flag(flag.get());
    const bool expect_flag = cfg.shape.batch > 0 && !reference::positions_in_range(in);
    CHECK((flag_status.code == StatusCode::kPositionOutOfRange) == expect_flag);
    CHECK((flag_status.ok() || flag_status.code == StatusCode::kPositionOutOfRange));

    // The kernel leaves its workspace zero for the next call.
    for (unsigned word : tickets.to_host()) CHECK(word == 0u);
  }
};

}  // namespace kvrope::testing
