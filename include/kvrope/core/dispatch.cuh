// Run-time head dim -> compile-time instance: one function template, one dispatch site per launcher.
#pragma once

#include <cstdint>
#include <type_traits>

namespace kvrope {

//! Head dims with a compile-time kernel instance; any other positive even D takes the generic path.
inline constexpr int kCompiledHeadDims[] = {64, 80, 96, 128, 256};

//! Calls f(std::integral_constant<int, D>) for a compiled head dim D, else
//! f(std::integral_constant<int, 0>) (the generic path, D read at run time).
template <typename F>
decltype(auto) dispatch_head_dim(int64_t head_dim, F&& f) {
  switch (head_dim) {
    case 64: return f(std::integral_constant<int, 64>{});
    case 80: return f(std::integral_constant<int, 80>{});
    case 96: return f(std::integral_constant<int, 96>{});
    case 128: return f(std::integral_constant<int, 128>{});
    case 256: return f(std::integral_constant<int, 256>{});
    default: return f(std::integral_constant<int, 0>{});
  }
}

}  // namespace kvrope
