// The Catch2 session runner, compiled once and shared by both test mains (test_main.cpp): with
// Catch2 v2 this translation unit also holds the whole Catch2 implementation, slow to compile.
#if KVROPE_CATCH2_MAJOR == 2
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#else
#include <catch2/catch_session.hpp>
#endif

namespace kvrope_test {

int run_catch(int argc, char* argv[]) { return Catch::Session().run(argc, argv); }

}  // namespace kvrope_test
