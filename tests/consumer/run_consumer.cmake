# Builds and runs tests/consumer against this kvrope build: cmake -DMODE=... -P run_consumer.cmake
#   MODE                find_package | add_subdirectory | fetchcontent
#   KVROPE_SOURCE_DIR   kvrope's source tree
#   KVROPE_BINARY_DIR   kvrope's build tree (installed to WORK_DIR/prefix in find_package mode)
#   WORK_DIR            scratch folder, emptied first
#   CONFIG, GENERATOR, GENERATOR_PLATFORM, MAKE_PROGRAM, CXX_COMPILER, CUDA_COMPILER,
#   CUDA_HOST_COMPILER  the parent build's, so the consumer uses the same tools
# One CUDA architecture (90) keeps it quick: the program only calls the host-side validate().
cmake_minimum_required(VERSION 3.24...4.4)

foreach(var IN ITEMS MODE KVROPE_SOURCE_DIR KVROPE_BINARY_DIR WORK_DIR GENERATOR CUDA_COMPILER)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "run_consumer.cmake: -D${var}=... is required")
  endif()
endforeach()
if(NOT CONFIG)
  set(CONFIG Release)
endif()

function(run_step what)
  string(TIMESTAMP start "%s")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc COMMAND_ECHO STDOUT)
  string(TIMESTAMP stop "%s")
  math(EXPR seconds "${stop} - ${start}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer ${MODE}: ${what} failed (${rc}) after ${seconds} s")
  endif()
  message(STATUS "consumer ${MODE}: ${what} ok (${seconds} s)")
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")
set(build "${WORK_DIR}/build")

set(configure_args
  -S "${KVROPE_SOURCE_DIR}/tests/consumer" -B "${build}"
  -G "${GENERATOR}"
  "-DCMAKE_BUILD_TYPE=${CONFIG}"
  "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}"
  "-DCMAKE_CUDA_COMPILER=${CUDA_COMPILER}"
  -DCMAKE_CUDA_ARCHITECTURES=90
  "-DKVROPE_SOURCE_DIR=${KVROPE_SOURCE_DIR}"
  # Only the prefix below may satisfy find_package(kvrope): no package registries.
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
  -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF)
if(GENERATOR_PLATFORM)
  list(APPEND configure_args -A "${GENERATOR_PLATFORM}")
endif()
if(MAKE_PROGRAM)
  list(APPEND configure_args "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
endif()
if(CUDA_HOST_COMPILER)
  list(APPEND configure_args "-DCMAKE_CUDA_HOST_COMPILER=${CUDA_HOST_COMPILER}")
endif()

if(MODE STREQUAL "find_package")
  run_step("install" "${CMAKE_COMMAND}" --install "${KVROPE_BINARY_DIR}" --prefix "${prefix}" --config "${CONFIG}")
  list(APPEND configure_args -DKVROPE_CONSUMER_MODE=find_package "-DCMAKE_PREFIX_PATH=${prefix}")
elseif(MODE STREQUAL "add_subdirectory")
  list(APPEND configure_args -DKVROPE_CONSUMER_MODE=subdirectory)
elseif(MODE STREQUAL "fetchcontent")
  list(APPEND configure_args -DKVROPE_CONSUMER_MODE=fetchcontent)
else()
  message(FATAL_ERROR "run_consumer.cmake: unknown MODE '${MODE}'")
endif()

run_step("configure" "${CMAKE_COMMAND}" ${configure_args})
if(MODE STREQUAL "find_package")
  # The package must come from the fresh install, not from some other kvrope on the machine.
  file(STRINGS "${build}/CMakeCache.txt" kvrope_dir_line REGEX "^kvrope_DIR:")
  string(REGEX REPLACE "^kvrope_DIR:[A-Z]+=" "" kvrope_dir "${kvrope_dir_line}")
  file(REAL_PATH "${prefix}" real_prefix)
  file(REAL_PATH "${kvrope_dir}" real_kvrope_dir)
  string(FIND "${real_kvrope_dir}" "${real_prefix}/" at)
  if(NOT at EQUAL 0)
    message(FATAL_ERROR "consumer find_package: kvrope_DIR is '${kvrope_dir}', not under '${prefix}'")
  endif()
endif()
run_step("build" "${CMAKE_COMMAND}" --build "${build}" --config "${CONFIG}")
run_step("run" "${build}/bin/kvrope_consumer")
