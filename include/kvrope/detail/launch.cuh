// The launch: picks the kernel instance, asks the device what the planner needs (cached), launches.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <tuple>

#include "../core/dispatch.cuh"
#include "../core/dtype.cuh"
#include "../core/status.cuh"
#include "decode/kernel.cuh"
#include "fused/kernel.cuh"
#include "plan.cuh"
#include "policy.cuh"

namespace kvrope::detail {

// A per-thread cache of a host-side query (each costs microseconds): the value for `key`, computed by
// query(&value) on a miss; the 8 newest keys are kept. One cache per call site.
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

// Whether `kernel` runs sm_90+ code: a build with only older PTX runs on Hopper through the JIT with
// the register copy, so the device's compute capability alone does not tell.
template <typename Kernel>
Status kernel_has_sm90_code(Kernel kernel, int device, bool* out) {
  return cached_query(std::make_tuple(reinterpret_cast<const void*>(kernel), device), out, [&](bool* sm90) {
    cudaFuncAttributes attr{};
    if (Status s = cuda_status(cudaFuncGetAttributes(&attr, kernel), "cudaFuncGetAttributes"); !s) return s;
    *sm90 = attr.ptxVersion >= 90;
    return Status{};
  });
}

// Blocks of `kernel` resident a SM at this shape. The first query of a kernel on a device allows it
// `allowed_shared` bytes of dynamic shared memory (the most any of its launches asks; 0: the default).
template <typename Kernel>
Status resident_blocks(Kernel kernel, int device, int block, int shared_bytes, int allowed_shared, int* out) {
  const auto key = std::make_tuple(reinterpret_cast<const void*>(kernel), device, block, shared_bytes);
  return cached_query(key, out, [&](int* blocks) {
    if (allowed_shared > 0)
      if (Status s =
              cuda_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, allowed_shared),
                          "cudaFuncSetAttribute");
          !s)
        return s;
    return cuda_status(cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, kernel, block, shared_bytes),
                       "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  });
}

inline Status device_attribute(cudaDeviceAttr attr, int device, int* out) {
  return cuda_status(cudaDeviceGetAttribute(out, attr, device), "cudaDeviceGetAttribute");
}

// The fused kernel's instance of a head dim and access width for the call's variant.
template <typename T, int kD, int kVec>
auto fused_instance(bool in_place) {
  return in_place ? backward_kernel<T, kD, kVec, true> : backward_kernel<T, kD, kVec, false>;
}

//! A call's rotation besides the default (rotate-half, R = D, table gradients per batch).
struct RotarySpec {
  int64_t rotary_dim = 0;  // R (0: D)
  RotaryStyle style = RotaryStyle::kRotateHalf;
  bool sum_batches = false;  // table gradients of batch stride 0 with B > 1: summed over the batch

  bool general(int64_t head_dim) const {
    return style != RotaryStyle::kRotateHalf || effective_rotary_dim(rotary_dim, head_dim) != head_dim || sum_batches;
  }
};

// Plans the call `a` (workspace: BackwardParams::workspace or null) on the current device with
// `policy` (null: the device's own) and launches it unless `plan_only`. `Dims`: the compiled head dims.
// A call with another rotation (RotarySpec::general) takes the general instance of the fused kernel.
template <typename Dims, typename T>
Status launch_backward(const ProblemArgs<T>& a, const RotarySpec& rotary, unsigned int* workspace,
                       const LaunchPolicy* policy, cudaStream_t stream, LaunchConfig* config_out, bool plan_only) {
  static_assert(kIsSupportedType<T>, "kvrope: T must be __nv_bfloat16, __half or float");
  constexpr int kWide = 16 / sizeof(T);
  LaunchConfig config{};
  const int64_t copy_elems = a.in_place ? 0 : 2 * a.batch * a.heads * a.cache_len * a.head_dim;
  if (a.batch == 0 || (a.batch * a.seq_len == 0 && copy_elems == 0)) {
    if (config_out) *config_out = config;
    return {};
  }
  const bool general = rotary.general(a.head_dim);
  const int64_t rotary_dim = effective_rotary_dim(rotary.rotary_dim, a.head_dim);
  const bool vec = vectorizable(a) && rotary_dim % (2 * kWide) == 0;
  BackwardPlan& plan = config.plan;
  int device = 0, major = 0;
  DeviceFacts facts{};
  if (Status s = cuda_status(cudaGetDevice(&device), "cudaGetDevice"); !s) return s;
  if (Status s = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, device, &facts.shared_optin); !s) return s;
  if (Status s = device_attribute(cudaDevAttrMultiProcessorCount, device, &facts.sms); !s) return s;
  if (Status s = device_attribute(cudaDevAttrComputeCapabilityMajor, device, &major); !s) return s;
  const LaunchPolicy pol = policy ? *policy : policy_for(major);

  if (!general && takes_decode(a, pol, vec)) {
    using Kernel = void (*)(DecodeArgs<T>);
    const Kernel kernel = kvrope::dispatch_head_dim<Dims>(a.head_dim, [&](auto d) -> Kernel {
      constexpr int kD = decltype(d)::value;
      plan.head_dim_instance = kD > 0 && decode_head_dim_ok<T>(kD) ? kD : 0;
      if constexpr (kD > 0 && decode_head_dim_ok<T>(kD)) return decode_kernel<T, kD>;
      return decode_kernel<T, 0>;
    });
    plan.path = plan.head_dim_instance ? BackwardPath::kCompiledHeadDim : BackwardPath::kGenericVectorized;
    const int block = decode_block(a, pol);
    int resident = 0;
    if (Status s = resident_blocks(kernel, device, block, 0, 0, &resident); !s) return s;
    const DecodeArgs<T> args = plan_decode(a, block, facts.sms, resident, config);
    if (config_out) *config_out = config;
    if (plan_only) return {};
    kernel<<<plan.grid, plan.block, plan.shared_bytes, stream>>>(args);
    return cuda_status(cudaGetLastError(), "kernel launch");
  }

  using Kernel = void (*)(FusedArgs<T>);
  Kernel kernel = fused_instance<T, 0, 1>(a.in_place);
  plan.path = BackwardPath::kGenericScalar;
  plan.vec_width = 1;
  if (general) {
    kernel = a.in_place ? backward_kernel<T, 0, 1, true, true> : backward_kernel<T, 0, 1, false, true>;
    if (vec) kernel = a.in_place ? backward_kernel<T, 0, kWide, true, true> : backward_kernel<T, 0, kWide, false, true>;
  }
  if (vec) {
    plan.vec_width = kWide;
    if (!general) {
      plan.head_dim_instance = kvrope::dispatch_head_dim<Dims>(a.head_dim, [&](auto d) {
        kernel = fused_instance<T, decltype(d)::value, kWide>(a.in_place);
        return decltype(d)::value;
      });
    }
    plan.path = plan.head_dim_instance ? BackwardPath::kCompiledHeadDim : BackwardPath::kGenericVectorized;
  }
  if (major >= 9)
    if (Status s = kernel_has_sm90_code(kernel, device, &facts.sm90_code); !s) return s;
  FusedArgs<T> args = plan_fused_block(a, pol, facts, vec, config);
  args.rotary_dim = rotary_dim;
  args.style = rotary.style;
  args.rotary_units = static_cast<int>(rotary_dim / (2 * std::min(plan.vec_width, kTokenVecMax)));
  args.sum_batches = rotary.sum_batches;
  int resident = 0;
  const int allowed_shared = static_cast<int>(std::min<int64_t>(kMaxSharedBytes, facts.shared_optin));
  if (Status s = resident_blocks(kernel, device, plan.block, plan.shared_bytes, allowed_shared, &resident); !s)
    return s;
  plan_fused_grid(args, pol, facts.sms, resident, workspace, config);
  if (config_out) *config_out = config;
  if (plan_only) return {};
  kernel<<<plan.grid, plan.block, plan.shared_bytes, stream>>>(args);
  return cuda_status(cudaGetLastError(), "kernel launch");
}

}  // namespace kvrope::detail
