# Host test: no source outside tests/ includes a file of tests/ (bench/, dev/, verify/, examples/ and
# include/ share code through verify/ instead). Fails on any #include whose path names a tests/ folder.
# With the include paths those targets get (the source root through kvrope_verify, never tests/), naming
# it is the only way such an include could still compile.
#   cmake -DSOURCE_DIR=... -P no_tests_includes.cmake
if(NOT DEFINED SOURCE_DIR)
  message(FATAL_ERROR "no_tests_includes.cmake: SOURCE_DIR is not set")
endif()
set(bad)
set(count 0)
foreach(dir IN ITEMS include verify bench dev examples)
  file(GLOB_RECURSE sources "${SOURCE_DIR}/${dir}/*.cu" "${SOURCE_DIR}/${dir}/*.cuh" "${SOURCE_DIR}/${dir}/*.hpp"
       "${SOURCE_DIR}/${dir}/*.cpp" "${SOURCE_DIR}/${dir}/*.h")
  foreach(source IN LISTS sources)
    math(EXPR count "${count} + 1")
    file(STRINGS "${source}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*[\"<][^\">]*tests/")
    foreach(line IN LISTS lines)
      file(RELATIVE_PATH rel "${SOURCE_DIR}" "${source}")
      list(APPEND bad "${rel}: ${line}")
    endforeach()
  endforeach()
endforeach()
if(count EQUAL 0)
  message(FATAL_ERROR "no source found under ${SOURCE_DIR}: the check would pass on nothing")
endif()
if(bad)
  string(REPLACE ";" "\n  " bad "${bad}")
  message(FATAL_ERROR "sources outside tests/ include files of tests/:\n  ${bad}")
endif()
message(STATUS "${count} sources outside tests/, none includes a file of tests/")
