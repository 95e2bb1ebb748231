// Catch2 v2/v3 compatibility header: test sources include this instead of a Catch2 header.
//
// KVROPE_CATCH2_MAJOR (2 or 3) comes from the build (cmake/kvrope-deps.cmake). Both versions have
// TEST_CASE, SECTION, REQUIRE, CHECK, INFO, CAPTURE, TEMPLATE_TEST_CASE, SUCCEED, FAIL, GENERATE,
// REQUIRE_THAT and the floating-point matchers; what differs is bridged here:
//   - Catch::Approx names the approximate comparator in both (v2 only had Catch::Detail::Approx);
//   - KVROPE_SKIP(msg) marks a test case skipped (v3 SKIP); v2 has no skip, so it warns and returns
//     from the enclosing test case (use it only directly in a TEST_CASE body, not inside a helper).
#pragma once

#ifndef KVROPE_CATCH2_MAJOR
#error "KVROPE_CATCH2_MAJOR is not defined: link the test target with kvrope_test_main or kvrope_gpu_test_main"
#endif

#if KVROPE_CATCH2_MAJOR == 2
#include <catch2/catch.hpp>

namespace Catch {
using Detail::Approx;
}  // namespace Catch

#define KVROPE_SKIP(msg)      \
  do {                        \
    WARN("SKIPPED: " << msg); \
    return;                   \
  } while (false)

#elif KVROPE_CATCH2_MAJOR == 3
#include <catch2/catch_all.hpp>

#define KVROPE_SKIP(msg) SKIP(msg)

#else
#error "KVROPE_CATCH2_MAJOR must be 2 or 3"
#endif
