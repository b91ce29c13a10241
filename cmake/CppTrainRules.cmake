# Bazel-shaped rules for the CMake build, so the root CMakeLists.txt reads like the BUILD files.
#
#   cpptrain_cc_proto_library(proto_job_cc_proto PROTOS proto/job.proto
#                             DEPS proto_model_cc_proto)
#   cpptrain_cc_library(base_logging SRCS base/logging.cc HDRS base/logging.h DEPS system_glog)
#   cpptrain_cc_binary(tools_train SRCS tools/train_main.cc DEPS ...)
#   cpptrain_cc_test(trainer_scheduler_test SIZE small SRCS trainer/scheduler_test.cc DEPS ...)
#   cpptrain_sh_test(tests_build_sync_test SRCS tests/build_sync_test.sh)
#
# Target names are the Bazel label with '/' and ':' turned into '_' (//trainer/data:batch ->
# trainer_data_batch, //trainer -> trainer_trainer). Paths are relative to the repository root
# and listed explicitly: tools/check_build_sync.sh compares them with the BUILD files.
#
# A target whose sources need CUDA (a file named *_cuda.cc, or REQUIRES_CUDA), NCCL (a file
# named nccl_*.cc, or REQUIRES_NCCL) or c10d's Gloo (a file named gloo_*.cc, or REQUIRES_GLOO)
# is skipped when the probe in CppTrainDeps.cmake did not find it, and so is every target that
# depends on a skipped one. (pip's LibTorch has CUDA and NCCL but no gloo headers; Debian's has
# Gloo but no CUDA.)
#
# Tests run like `bazel test` (cmake/run_test.sh): each gets its own runfiles tree at
# TEST_SRCDIR/TEST_WORKSPACE holding only its DATA (as Bazel's data attribute), rebuilt on
# every run, and a fresh, empty TEST_TMPDIR; the test runs inside the runfiles tree.
# DATA entries: "config/testdata/full.textproto" (a source path, linked at the same path),
# "tools/launch=$<TARGET_FILE:tools_launch>" (DEST=SRC: a built file at its Bazel path), or
# ".=<dir>" (the whole workspace is <dir>).

#
# Paths are the project's own, also when it is a subproject of another build
# (add_subdirectory): CPPTRAIN_SOURCE_DIR is the checkout (the directory above this file) and
# CPPTRAIN_BINARY_DIR the build directory of the CMakeLists.txt including this file, never
# CMAKE_SOURCE_DIR / CMAKE_BINARY_DIR (the top-level project's).
#
# CPPTRAIN_BUILD_TESTS OFF skips tests and TESTONLY targets; CPPTRAIN_BUILD_TOOLS OFF skips
# targets whose sources are in tools/ (both quietly; their dependents are skipped as well).
# Libraries that are neither are the package: cpptrain_package() (CppTrainPackage.cmake)
# links them into the umbrella target and installs them with their headers.

include_guard(GLOBAL)
include(GNUInstallDirs)

set(_CPPTRAIN_RULES_DIR "${CMAKE_CURRENT_LIST_DIR}")
get_filename_component(CPPTRAIN_SOURCE_DIR "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)
set(CPPTRAIN_BINARY_DIR "${CMAKE_CURRENT_BINARY_DIR}")
set(CPPTRAIN_WORKSPACE_NAME "cpptrain" CACHE STRING "Bazel workspace name (WORKSPACE) for TEST_WORKSPACE")
set(CPPTRAIN_TEST_ROOT "${CPPTRAIN_BINARY_DIR}/testenv")
set(CPPTRAIN_GEN_DIR "${CPPTRAIN_BINARY_DIR}/gen")
file(MAKE_DIRECTORY "${CPPTRAIN_TEST_ROOT}" "${CPPTRAIN_GEN_DIR}")
# Where installed headers go: <prefix>/include/cpptrain/trainer/trainer.h is included as
# "trainer/trainer.h", as in this tree.
set(CPPTRAIN_INSTALL_INCLUDE_SUBDIR "cpptrain")

# While BUILD files name sources that are still being written, -DCPPTRAIN_SKIP_MISSING_SOURCES=ON
# skips those targets (and their dependents) instead of failing the configure step.
option(CPPTRAIN_SKIP_MISSING_SOURCES "Skip targets whose listed sources do not exist yet" OFF)

# Bazel's test timeouts by size.
set(_CPPTRAIN_TIMEOUT_small 60)
set(_CPPTRAIN_TIMEOUT_medium 300)
set(_CPPTRAIN_TIMEOUT_large 900)
set(_CPPTRAIN_TIMEOUT_enormous 3600)

# Sets <out_var> to TRUE when one of the sources is in tools/.
function(_cpptrain_is_tool out_var)
  foreach(src IN LISTS ARGN)
    if(src MATCHES "^tools/")
      set(${out_var} TRUE PARENT_SCOPE)
      return()
    endif()
  endforeach()
  set(${out_var} FALSE PARENT_SCOPE)
endfunction()

# Sets <out_var> to TRUE when the target must be skipped, and says why.
function(_cpptrain_should_skip name out_var)
  cmake_parse_arguments(PARSE_ARGV 2 ARG "REQUIRES_CUDA;REQUIRES_NCCL;REQUIRES_GLOO;TESTONLY"
                        "" "SRCS;DEPS")
  set(need_cuda ${ARG_REQUIRES_CUDA})
  set(need_nccl ${ARG_REQUIRES_NCCL})
  set(need_gloo ${ARG_REQUIRES_GLOO})
  _cpptrain_is_tool(is_tool ${ARG_SRCS})
  # Turned off by an option: skipped without a message (dependents too).
  if((ARG_TESTONLY AND NOT CPPTRAIN_BUILD_TESTS) OR (is_tool AND NOT CPPTRAIN_BUILD_TOOLS))
    set_property(GLOBAL APPEND PROPERTY CPPTRAIN_SKIPPED_TARGETS ${name})
    set_property(GLOBAL APPEND PROPERTY CPPTRAIN_QUIETLY_SKIPPED_TARGETS ${name})
    set(${out_var} TRUE PARENT_SCOPE)
    return()
  endif()
  foreach(src IN LISTS ARG_SRCS)
    get_filename_component(base "${src}" NAME)
    if(base MATCHES "_cuda\\.(cc|cu)$")
      set(need_cuda ON)
    endif()
    if(base MATCHES "^nccl_.*\\.(cc|cu)$")
      set(need_nccl ON)
    endif()
    if(base MATCHES "^gloo_.*\\.cc$")
      set(need_gloo ON)
    endif()
  endforeach()
  set(reason "")
  if(CPPTRAIN_SKIP_MISSING_SOURCES)
    foreach(src IN LISTS ARG_SRCS)
      if(NOT IS_ABSOLUTE "${src}" AND NOT EXISTS "${CPPTRAIN_SOURCE_DIR}/${src}")
        set(reason "${src} does not exist")
        break()
      endif()
    endforeach()
  endif()
  if(reason)
  elseif(need_cuda AND NOT CPPTRAIN_HAS_CUDA)
    set(reason "needs CUDA")
  elseif(need_nccl AND NOT CPPTRAIN_HAS_NCCL)
    set(reason "needs NCCL")
  elseif(need_gloo AND NOT CPPTRAIN_HAS_GLOO)
    set(reason "needs c10d Gloo headers")
  else()
    get_property(skipped GLOBAL PROPERTY CPPTRAIN_SKIPPED_TARGETS)
    get_property(quiet GLOBAL PROPERTY CPPTRAIN_QUIETLY_SKIPPED_TARGETS)
    foreach(dep IN LISTS ARG_DEPS)
      if(dep IN_LIST skipped)
        if(dep IN_LIST quiet)
          set_property(GLOBAL APPEND PROPERTY CPPTRAIN_QUIETLY_SKIPPED_TARGETS ${name})
        endif()
        set(reason "depends on skipped ${dep}")
        break()
      endif()
    endforeach()
  endif()
  if(reason)
    get_property(quiet GLOBAL PROPERTY CPPTRAIN_QUIETLY_SKIPPED_TARGETS)
    if(NOT name IN_LIST quiet)
      message(STATUS "cpptrain: skipping ${name} (${reason})")
    endif()
    set_property(GLOBAL APPEND PROPERTY CPPTRAIN_SKIPPED_TARGETS ${name})
    set(${out_var} TRUE PARENT_SCOPE)
  else()
    set(${out_var} FALSE PARENT_SCOPE)
    if(need_nccl)
      set(_cpptrain_extra_deps system_nccl PARENT_SCOPE)
    endif()
  endif()
endfunction()

function(_cpptrain_common_target_setup name)
  target_include_directories(${name} PRIVATE "${CPPTRAIN_SOURCE_DIR}" "${CPPTRAIN_GEN_DIR}")
endfunction()

# Include directories of a library: the checkout and the generated headers while building,
# <prefix>/include/cpptrain once installed.
set(_CPPTRAIN_LIBRARY_INCLUDES
    "$<BUILD_INTERFACE:${CPPTRAIN_SOURCE_DIR}>"
    "$<BUILD_INTERFACE:${CPPTRAIN_GEN_DIR}>"
    "$<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}/${CPPTRAIN_INSTALL_INCLUDE_SUBDIR}>")

# cpptrain_cc_library(<name> [SRCS ...] [HDRS ...] [DEPS ...] [REQUIRES_CUDA] [REQUIRES_NCCL]
#                     [REQUIRES_GLOO] [TESTONLY])
# Header-only libraries (no .cc/.cu in SRCS) become INTERFACE libraries; the others STATIC.
# TESTONLY (Bazel's testonly) libraries are built only with CPPTRAIN_BUILD_TESTS.
function(cpptrain_cc_library name)
  cmake_parse_arguments(PARSE_ARGV 1 ARG "REQUIRES_CUDA;REQUIRES_NCCL;REQUIRES_GLOO;TESTONLY" "" "SRCS;HDRS;DEPS")
  set(_cpptrain_extra_deps "")
  set(flags "")
  if(ARG_TESTONLY)
    list(APPEND flags TESTONLY)
  endif()
  if(ARG_REQUIRES_CUDA)
    list(APPEND flags REQUIRES_CUDA)
  endif()
  if(ARG_REQUIRES_NCCL)
    list(APPEND flags REQUIRES_NCCL)
  endif()
  if(ARG_REQUIRES_GLOO)
    list(APPEND flags REQUIRES_GLOO)
  endif()
  _cpptrain_should_skip(${name} skip ${flags} SRCS ${ARG_SRCS} ${ARG_HDRS} DEPS ${ARG_DEPS})
  if(skip)
    return()
  endif()
  set(compiled ${ARG_SRCS})
  list(FILTER compiled INCLUDE REGEX "\\.(cc|cpp|cu)$")
  if(compiled)
    add_library(${name} STATIC ${ARG_SRCS} ${ARG_HDRS})
    target_include_directories(${name} PUBLIC ${_CPPTRAIN_LIBRARY_INCLUDES})
    target_link_libraries(${name} PUBLIC ${ARG_DEPS} ${_cpptrain_extra_deps})
  else()
    add_library(${name} INTERFACE)
    target_include_directories(${name} INTERFACE ${_CPPTRAIN_LIBRARY_INCLUDES})
    target_link_libraries(${name} INTERFACE ${ARG_DEPS} ${_cpptrain_extra_deps})
  endif()
  _cpptrain_is_tool(is_tool ${ARG_SRCS} ${ARG_HDRS})
  if(NOT ARG_TESTONLY AND NOT is_tool)
    cpptrain_package_library(${name} HEADERS ${ARG_SRCS} ${ARG_HDRS})
  endif()
endfunction()

# cpptrain_cc_binary(<name> SRCS ... [DEPS ...] [PACKAGE <dir>] [OUTPUT_NAME <file name>])
# With PACKAGE and OUTPUT_NAME the executable lands in <build>/<PACKAGE>/<OUTPUT_NAME>, where
# bazel-bin has it (tools_train -> <build>/tools/train); otherwise <build>/<name>.
function(cpptrain_cc_binary name)
  cmake_parse_arguments(PARSE_ARGV 1 ARG "REQUIRES_CUDA;REQUIRES_NCCL;REQUIRES_GLOO;TESTONLY" "PACKAGE;OUTPUT_NAME"
                        "SRCS;DEPS")
  set(_cpptrain_extra_deps "")
  set(flags "")
  if(ARG_TESTONLY)
    list(APPEND flags TESTONLY)
  endif()
  if(ARG_REQUIRES_CUDA)
    list(APPEND flags REQUIRES_CUDA)
  endif()
  if(ARG_REQUIRES_NCCL)
    list(APPEND flags REQUIRES_NCCL)
  endif()
  if(ARG_REQUIRES_GLOO)
    list(APPEND flags REQUIRES_GLOO)
  endif()
  _cpptrain_should_skip(${name} skip ${flags} SRCS ${ARG_SRCS} DEPS ${ARG_DEPS})
  if(skip)
    set(CPPTRAIN_LAST_TARGET_SKIPPED TRUE PARENT_SCOPE)
    return()
  endif()
  set(CPPTRAIN_LAST_TARGET_SKIPPED FALSE PARENT_SCOPE)
  add_executable(${name} ${ARG_SRCS})
  _cpptrain_common_target_setup(${name})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} ${_cpptrain_extra_deps})
  if(ARG_PACKAGE)
    set_target_properties(${name} PROPERTIES
                          RUNTIME_OUTPUT_DIRECTORY "${CPPTRAIN_BINARY_DIR}/${ARG_PACKAGE}")
  endif()
  if(ARG_OUTPUT_NAME)
    set_target_properties(${name} PROPERTIES OUTPUT_NAME "${ARG_OUTPUT_NAME}")
  endif()
endfunction()

# cpptrain_glob_data(<out_var> <dir>...): every file under each directory, as paths relative to
# the source root in sorted order (Bazel's glob(["<dir>/**"])), for a test's DATA. Golden
# directories written by a generator script hold the same few files each.
function(cpptrain_glob_data out_var)
  set(files "")
  foreach(dir ${ARGN})
    file(GLOB_RECURSE found RELATIVE "${CPPTRAIN_SOURCE_DIR}" CONFIGURE_DEPENDS
         "${CPPTRAIN_SOURCE_DIR}/${dir}/*")
    if(NOT found)
      message(FATAL_ERROR "cpptrain_glob_data: ${dir} has no files")
    endif()
    list(SORT found)
    list(APPEND files ${found})
  endforeach()
  set(${out_var} ${files} PARENT_SCOPE)
endfunction()

# Registers a test command with the Bazel test environment.
# _cpptrain_add_test(<name> <size> <data list var> <command> [<arg>...])
function(_cpptrain_add_test name size data_var)
  if(NOT size)
    set(size medium)  # Bazel's default
  endif()
  if(NOT DEFINED _CPPTRAIN_TIMEOUT_${size})
    message(FATAL_ERROR "${name}: SIZE must be small, medium, large or enormous, not '${size}'")
  endif()
  set(links "")
  foreach(entry IN LISTS ${data_var})
    if(entry MATCHES "^([^=]+)=(.+)$")
      list(APPEND links -l "${entry}")
    else()
      list(APPEND links -l "${entry}=${CPPTRAIN_SOURCE_DIR}/${entry}")
    endif()
  endforeach()
  set(env_dir "${CPPTRAIN_TEST_ROOT}/${name}")
  add_test(NAME ${name}
           COMMAND /bin/sh "${_CPPTRAIN_RULES_DIR}/run_test.sh" ${links} -- ${ARGN}
           WORKING_DIRECTORY "${CPPTRAIN_TEST_ROOT}")
  set_tests_properties(${name} PROPERTIES
    TIMEOUT ${_CPPTRAIN_TIMEOUT_${size}}
    LABELS "${size}"
    ENVIRONMENT
      "TEST_SRCDIR=${env_dir}/runfiles;TEST_WORKSPACE=${CPPTRAIN_WORKSPACE_NAME};TEST_TMPDIR=${env_dir}/tmp;OMP_NUM_THREADS=1")
endfunction()

# Sets <out_var> TRUE when one of <list var>'s entries names a skipped target via
# $<TARGET_FILE:...>.
function(_cpptrain_names_skipped_target name list_var out_var)
  get_property(skipped GLOBAL PROPERTY CPPTRAIN_SKIPPED_TARGETS)
  foreach(entry IN LISTS ${list_var})
    if(entry MATCHES "\\$<TARGET_FILE:([^>]+)>")
      set(target "${CMAKE_MATCH_1}")
      if(target IN_LIST skipped)
        message(STATUS "cpptrain: skipping ${name} (depends on skipped ${target})")
        set(${out_var} TRUE PARENT_SCOPE)
        return()
      endif()
    endif()
  endforeach()
  set(${out_var} FALSE PARENT_SCOPE)
endfunction()

# cpptrain_cc_test(<name> SRCS ... [DEPS ...] [SIZE small|medium|large] [DATA ...]
#                  [PACKAGE <dir>] [OUTPUT_NAME <file name>])
function(cpptrain_cc_test name)
  cmake_parse_arguments(PARSE_ARGV 1 ARG "REQUIRES_CUDA;REQUIRES_NCCL;REQUIRES_GLOO" "SIZE;PACKAGE;OUTPUT_NAME"
                        "SRCS;DEPS;DATA")
  if(NOT CPPTRAIN_BUILD_TESTS)
    return()
  endif()
  _cpptrain_names_skipped_target(${name} ARG_DATA skip)
  if(skip)
    set_property(GLOBAL APPEND PROPERTY CPPTRAIN_SKIPPED_TARGETS ${name})
    return()
  endif()
  set(flags "")
  if(ARG_REQUIRES_CUDA)
    list(APPEND flags REQUIRES_CUDA)
  endif()
  if(ARG_REQUIRES_NCCL)
    list(APPEND flags REQUIRES_NCCL)
  endif()
  if(ARG_REQUIRES_GLOO)
    list(APPEND flags REQUIRES_GLOO)
  endif()
  set(extra "")
  if(ARG_PACKAGE)
    list(APPEND extra PACKAGE ${ARG_PACKAGE})
  endif()
  if(ARG_OUTPUT_NAME)
    list(APPEND extra OUTPUT_NAME ${ARG_OUTPUT_NAME})
  endif()
  cpptrain_cc_binary(${name} TESTONLY ${flags} ${extra} SRCS ${ARG_SRCS} DEPS ${ARG_DEPS}
                     system_gtest_main)
  if(CPPTRAIN_LAST_TARGET_SKIPPED)
    return()
  endif()
  _cpptrain_add_test(${name} "${ARG_SIZE}" ARG_DATA "$<TARGET_FILE:${name}>")
endfunction()

# cpptrain_sh_test(<name> SRCS <script> [SIZE ...] [DATA ...] [ARGS <arg> ...])
# ARGS stand for Bazel's args; write $(location :x) as $<TARGET_FILE:x> or an absolute source
# path. The test is skipped when an executable it names through $<TARGET_FILE:...> was.
function(cpptrain_sh_test name)
  cmake_parse_arguments(PARSE_ARGV 1 ARG "" "SIZE;SRCS" "ARGS;DATA")
  if(NOT CPPTRAIN_BUILD_TESTS)
    return()
  endif()
  set(named ${ARG_ARGS} ${ARG_DATA})
  _cpptrain_names_skipped_target(${name} named skip)
  if(skip)
    return()
  endif()
  _cpptrain_add_test(${name} "${ARG_SIZE}" ARG_DATA
                     /bin/bash "${CPPTRAIN_SOURCE_DIR}/${ARG_SRCS}"
                     ${ARG_ARGS})
endfunction()

# cpptrain_cc_proto_library(<name> PROTOS <a.proto ...> [DEPS <other cc_proto targets>])
# Generates <build>/gen/<path>.pb.{h,cc} with the system protoc; imports resolve from the
# repository root ("proto/engines.proto"), as in Bazel.
function(cpptrain_cc_proto_library name)
  cmake_parse_arguments(PARSE_ARGV 1 ARG "" "" "PROTOS;DEPS")
  set(generated "")
  foreach(proto IN LISTS ARG_PROTOS)
    string(REGEX REPLACE "\\.proto$" "" stem "${proto}")
    set(out_cc "${CPPTRAIN_GEN_DIR}/${stem}.pb.cc")
    set(out_h "${CPPTRAIN_GEN_DIR}/${stem}.pb.h")
    add_custom_command(
      OUTPUT "${out_cc}" "${out_h}"
      COMMAND "${Protobuf_PROTOC_EXECUTABLE}" "--proto_path=${CPPTRAIN_SOURCE_DIR}"
              "--cpp_out=${CPPTRAIN_GEN_DIR}" "${proto}"
      DEPENDS "${CPPTRAIN_SOURCE_DIR}/${proto}" "${Protobuf_PROTOC_EXECUTABLE}"
      WORKING_DIRECTORY "${CPPTRAIN_SOURCE_DIR}"
      COMMENT "protoc ${proto}"
      VERBATIM)
    list(APPEND generated "${out_cc}" "${out_h}")
  endforeach()
  add_library(${name} STATIC ${generated})
  target_include_directories(${name} PUBLIC
    "$<BUILD_INTERFACE:${CPPTRAIN_GEN_DIR}>"
    "$<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}/${CPPTRAIN_INSTALL_INCLUDE_SUBDIR}>")
  target_link_libraries(${name} PUBLIC system_protobuf ${ARG_DEPS})
  # Generated code is not ours to lint.
  set_target_properties(${name} PROPERTIES CXX_CLANG_TIDY "")
  # Installed: the generated headers and the .proto files, beside each other.
  cpptrain_package_library(${name} HEADERS ${generated} ${ARG_PROTOS})
endfunction()
