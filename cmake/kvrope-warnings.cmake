# Warning and debug-info flags for kvrope's own targets (tests, examples, benchmarks); never for consumers.
include_guard(GLOBAL)

#! kvrope_set_warnings(<target>)
#! Host compiler: -Wall -Wextra (plus -Werror with KVROPE_WARNINGS_AS_ERRORS), passed through
#! -Xcompiler for CUDA sources. nvcc: -Werror=all-warnings with KVROPE_WARNINGS_AS_ERRORS, and
#! -lineinfo so profilers and compute-sanitizer can map SASS back to source lines.
function(kvrope_set_warnings target)
  set(host_flags -Wall -Wextra)
  if(KVROPE_WARNINGS_AS_ERRORS)
    list(APPEND host_flags -Werror)
  endif()
  list(JOIN host_flags "," host_flags_csv)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:${host_flags}>
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=${host_flags_csv}>
    $<$<COMPILE_LANGUAGE:CUDA>:-lineinfo>)
  if(KVROPE_WARNINGS_AS_ERRORS)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings>)
  endif()
endfunction()
