# Test and benchmark dependencies: an installed package when find_package finds one, else FetchContent.
include_guard(GLOBAL)
include(FetchContent)

# Fetched dependencies are third-party code: their headers must not trip our warning flags.
function(_kvrope_mark_system_includes target)
  get_target_property(real ${target} ALIASED_TARGET)
  if(real)
    set(target ${real})
  endif()
  get_target_property(dirs ${target} INTERFACE_INCLUDE_DIRECTORIES)
  if(dirs)
    set_property(TARGET ${target} APPEND PROPERTY INTERFACE_SYSTEM_INCLUDE_DIRECTORIES ${dirs})
  endif()
endfunction()

#! kvrope_find_catch2()
#! Provides the target Catch2::Catch2 and sets KVROPE_CATCH2_MAJOR (2 or 3) in the caller's scope.
#! Catch2 v2 (Debian 12: 2.13.10, header <catch2/catch.hpp>) and v3 (<catch2/catch_all.hpp>) both
#! work; tests/support/catch.hpp hides the difference. Without an installed Catch2, v3.7.1 is fetched.
function(kvrope_find_catch2)
  if(NOT TARGET Catch2::Catch2)
    find_package(Catch2 QUIET)
    if(Catch2_FOUND)
      string(REGEX MATCH "^[0-9]+" major "${Catch2_VERSION}")
      message(STATUS "kvrope: using installed Catch2 ${Catch2_VERSION} (${Catch2_DIR})")
    else()
      message(STATUS "kvrope: Catch2 not found, fetching v3.7.1")
      set(CATCH_INSTALL_DOCS OFF)
      set(CATCH_INSTALL_EXTRAS OFF)
      FetchContent_Declare(Catch2
        GIT_REPOSITORY https://github.com/catchorg/Catch2.git
        GIT_TAG v3.7.1
        GIT_SHALLOW TRUE)
      FetchContent_MakeAvailable(Catch2)
      _kvrope_mark_system_includes(Catch2::Catch2)
      set(major 3)
    endif()
    if(NOT major MATCHES "^[23]$")
      message(FATAL_ERROR "kvrope: Catch2 v2 or v3 is needed, found version '${Catch2_VERSION}'")
    endif()
    set_property(GLOBAL PROPERTY KVROPE_CATCH2_MAJOR ${major})
  endif()
  get_property(major GLOBAL PROPERTY KVROPE_CATCH2_MAJOR)
  set(KVROPE_CATCH2_MAJOR ${major} PARENT_SCOPE)
endfunction()

#! kvrope_find_benchmark()
#! Provides the target benchmark::benchmark (Google Benchmark): installed, else v1.9.1 fetched.
function(kvrope_find_benchmark)
  if(TARGET benchmark::benchmark)
    return()
  endif()
  find_package(benchmark QUIET)
  if(benchmark_FOUND)
    message(STATUS "kvrope: using installed Google Benchmark ${benchmark_VERSION} (${benchmark_DIR})")
    return()
  endif()
  message(STATUS "kvrope: Google Benchmark not found, fetching v1.9.1")
  set(CMAKE_POLICY_DEFAULT_CMP0077 NEW)  # let the variables below override benchmark's option()s
  set(BENCHMARK_ENABLE_TESTING OFF)
  set(BENCHMARK_ENABLE_GTEST_TESTS OFF)
  set(BENCHMARK_ENABLE_INSTALL OFF)
  set(BENCHMARK_INSTALL_DOCS OFF)
  set(BENCHMARK_ENABLE_WERROR OFF)
  FetchContent_Declare(benchmark
    GIT_REPOSITORY https://github.com/google/benchmark.git
    GIT_TAG v1.9.1
    GIT_SHALLOW TRUE)
  FetchContent_MakeAvailable(benchmark)
  _kvrope_mark_system_includes(benchmark::benchmark)
endfunction()
