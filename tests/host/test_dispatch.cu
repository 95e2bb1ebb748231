// Host tests of the run-time head dim -> compile-time instance dispatch.
#include <kvrope/core/dispatch.cuh>

#include "support/catch.hpp"

TEST_CASE("every compiled head dim reaches its own instance, others the generic one", "[host][dispatch]") {
  auto instance = [](int64_t d) { return kvrope::dispatch_head_dim(d, [](auto hd) { return decltype(hd)::value; }); };
  for (int d : {64, 80, 96, 128, 256}) CHECK(instance(d) == d);
  for (int64_t d : {2, 32, 48, 72, 112, 160, 192, 512}) CHECK(instance(d) == 0);
}

TEST_CASE("a smaller set of head dims compiles only those instances", "[host][dispatch]") {
  auto instance = [](int64_t d) {
    return kvrope::dispatch_head_dim<kvrope::HeadDims<128>>(d, [](auto hd) { return decltype(hd)::value; });
  };
  CHECK(instance(128) == 128);
  for (int64_t d : {64, 80, 96, 256}) CHECK(instance(d) == 0);
  auto none = [](int64_t d) {
    return kvrope::dispatch_head_dim<kvrope::HeadDims<>>(d, [](auto hd) { return decltype(hd)::value; });
  };
  CHECK(none(128) == 0);
}
