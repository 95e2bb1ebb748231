// Host tests of the run-time head dim -> compile-time instance dispatch.
#include <kvrope/core/dispatch.cuh>

#include "support/catch.hpp"

TEST_CASE("every compiled head dim reaches its own instance, others the generic one", "[host][dispatch]") {
  auto instance = [](int64_t d) { return kvrope::dispatch_head_dim(d, [](auto hd) { return decltype(hd)::value; }); };
  for (int d : kvrope::kCompiledHeadDims) CHECK(instance(d) == d);
  for (int64_t d : {2, 32, 48, 72, 112, 160, 192, 512}) CHECK(instance(d) == 0);
  CHECK(sizeof(kvrope::kCompiledHeadDims) / sizeof(int) == 5);
}
