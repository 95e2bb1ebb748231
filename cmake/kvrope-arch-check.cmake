# kvrope_check_cuda_architectures(): warns at configure time when no CUDA architecture the project
# builds for is sm_90 or later: such a build runs on Hopper and Blackwell without the bulk copy.
include_guard(GLOBAL)

function(kvrope_check_cuda_architectures)
  set(archs "${CMAKE_CUDA_ARCHITECTURES}")
  if(archs MATCHES "^(native|all|all-major)$")
    return()
  endif()
  foreach(arch IN LISTS archs)
    string(REGEX MATCH "^[0-9]+" number "${arch}")
    if(number AND number GREATER_EQUAL 90)
      return()
    endif()
  endforeach()
  message(WARNING "kvrope: CMAKE_CUDA_ARCHITECTURES is '${archs}', with nothing for sm_90 or later. On Hopper and "
                  "Blackwell the kernels then run without the bulk copy (slower). Set CMAKE_CUDA_ARCHITECTURES, "
                  "for example to 90 or 90;100a or native, before project() or on the command line.")
endfunction()
