// The launchers the GPU tests and the benchmark call, each compiled once (the kvrope_launchers library,
// verify/launchers_<dtype>.cu) rather than in every file that calls it: this header only declares them.
#pragma once

#include "verify/launch_policy.cuh"
#include <kvrope/kvrope.cuh>

namespace kvrope::testing {

//! kv_cache_rope_backward / _forward and the plans, for element type T and position type Pos.
template <typename T, typename Pos>
struct Launchers {
  using Out = BackwardParams<T, Pos>;
  using In = BackwardInPlaceParams<T, Pos>;
  using Policy = experimental::LaunchPolicy;
  using Config = experimental::LaunchConfig;

  static Status backward(const Out& p, cudaStream_t stream);
  static Status backward(const In& p, cudaStream_t stream);
  static Status backward(const Out& p, const Policy& policy, cudaStream_t stream);  // experimental
  static Status backward(const In& p, const Policy& policy, cudaStream_t stream);   // experimental
  static Status plan(const Out& p, BackwardPlan* plan);
  static Status plan(const In& p, BackwardPlan* plan);
  static Status plan(const Out& p, const Policy* policy, Config* config);  // experimental
  static Status plan(const In& p, const Policy* policy, Config* config);   // experimental
  static Status forward(const ForwardParams<T, Pos>& p, cudaStream_t stream);
  static Status plan(const ForwardParams<T, Pos>& p, ForwardPlan* plan);
};

}  // namespace kvrope::testing
