# The cpptrain package for other CMake projects: one umbrella target linking every library of
# the project, and (with CPPTRAIN_INSTALL) install rules with an exported CMake package.
#
#   cmake -S . -B build && cmake --build build --target cpptrain -j2   # the libraries only
#   cmake --install build --prefix /opt/cpptrain
#   # another project, configured with -DCMAKE_PREFIX_PATH=/opt/cpptrain:
#   find_package(cpptrain CONFIG REQUIRED)
#   target_link_libraries(app PRIVATE cpptrain::cpptrain)
#
# or, building cpptrain inside that project: add_subdirectory(path/to/cpptrain cpptrain
# EXCLUDE_FROM_ALL) and the same target_link_libraries (cpptrain::cpptrain is an alias there).
#
# Installed layout: headers (and the generated *.pb.h, beside their .proto) under
# include/cpptrain/, included as in this tree ("trainer/trainer.h", "proto/job.pb.h"); the
# static libraries under lib/cpptrain/; the package in lib/cmake/cpptrain/. Every exported
# target is cpptrain::<CMake name> (cpptrain::trainer_trainer, ...). The package finds the
# LibTorch, protobuf, Abseil and glog the project was built with (cpptrainConfig.cmake.in).
#
# The package libraries are the ones cpptrain_cc_library and cpptrain_cc_proto_library built
# that are neither TESTONLY nor in tools/ (CppTrainRules.cmake registers them here).

include_guard(GLOBAL)
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(CPPTRAIN_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/cpptrain")
set(_CPPTRAIN_PACKAGE_DIR "${CMAKE_CURRENT_LIST_DIR}")

# cpptrain_package_library(<target> HEADERS <file>...)
# Registers a library of the package and installs its headers (.h/.hpp/.cuh/.proto among
# <file>s: paths relative to the checkout, or absolute paths of generated files under
# CPPTRAIN_GEN_DIR), keeping their directories.
function(cpptrain_package_library name)
  cmake_parse_arguments(PARSE_ARGV 1 ARG "" "" "HEADERS")
  set_property(GLOBAL APPEND PROPERTY CPPTRAIN_PACKAGE_LIBRARIES ${name})
  if(NOT CPPTRAIN_INSTALL)
    return()
  endif()
  foreach(file IN LISTS ARG_HEADERS)
    if(NOT file MATCHES "\\.(h|hpp|cuh|proto)$")
      continue()
    endif()
    if(IS_ABSOLUTE "${file}")
      file(RELATIVE_PATH relative "${CPPTRAIN_GEN_DIR}" "${file}")
      if(relative MATCHES "^\\.\\./")
        message(FATAL_ERROR
                "cpptrain: ${name}: cannot install ${file}: not under ${CPPTRAIN_GEN_DIR}")
      endif()
      set(source "${file}")
    else()
      set(relative "${file}")
      set(source "${CPPTRAIN_SOURCE_DIR}/${file}")
    endif()
    get_filename_component(dir "${relative}" DIRECTORY)
    install(FILES "${source}"
            DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}/${CPPTRAIN_INSTALL_INCLUDE_SUBDIR}/${dir}")
  endforeach()
endfunction()

# Appends to <out_var> every target of this build that <target> links, directly or not
# (imported targets, such as torch or absl::status, come from the package's dependencies).
function(_cpptrain_link_closure target out_var)
  set(closure ${${out_var}})
  set(pending ${target})
  while(pending)
    list(POP_FRONT pending current)
    get_target_property(aliased ${current} ALIASED_TARGET)
    if(aliased)
      set(current ${aliased})
    endif()
    get_target_property(imported ${current} IMPORTED)
    if(imported OR current IN_LIST closure)
      continue()
    endif()
    list(APPEND closure ${current})
    get_target_property(links ${current} INTERFACE_LINK_LIBRARIES)
    foreach(link IN LISTS links)
      string(REGEX REPLACE "^\\$<LINK_ONLY:(.*)>$" "\\1" link "${link}")
      if(TARGET "${link}")
        list(APPEND pending ${link})
      endif()
    endforeach()
  endwhile()
  set(${out_var} ${closure} PARENT_SCOPE)
endfunction()

# cpptrain_package(<name>)
# Defines the umbrella INTERFACE library cpptrain::<name> (target <name>_umbrella) linking
# every package library, and the target <name> that builds them all (an INTERFACE library has
# no build rule of its own: `cmake --build build --target <name>`). With CPPTRAIN_INSTALL,
# installs the umbrella with everything it links.
function(cpptrain_package name)
  get_property(libraries GLOBAL PROPERTY CPPTRAIN_PACKAGE_LIBRARIES)
  set(umbrella ${name}_umbrella)
  add_library(${umbrella} INTERFACE)
  set_target_properties(${umbrella} PROPERTIES EXPORT_NAME ${name})
  target_link_libraries(${umbrella} INTERFACE ${libraries})
  # The headers need C++17; this reaches the application's own targets too.
  target_compile_features(${umbrella} INTERFACE cxx_std_17)
  add_library(cpptrain::${name} ALIAS ${umbrella})

  add_custom_target(${name})
  foreach(library IN LISTS libraries)
    get_target_property(type ${library} TYPE)
    if(NOT type STREQUAL "INTERFACE_LIBRARY")
      add_dependencies(${name} ${library})
    endif()
  endforeach()

  list(LENGTH libraries count)
  message(STATUS "cpptrain: cpptrain::${name} links ${count} libraries; "
                 "tests ${CPPTRAIN_BUILD_TESTS}, tools ${CPPTRAIN_BUILD_TOOLS}, "
                 "install ${CPPTRAIN_INSTALL}")
  if(NOT CPPTRAIN_INSTALL)
    return()
  endif()

  set(exported "")
  _cpptrain_link_closure(${umbrella} exported)
  install(TARGETS ${exported} EXPORT cpptrainTargets
          ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}/cpptrain")
  install(EXPORT cpptrainTargets NAMESPACE cpptrain:: DESTINATION "${CPPTRAIN_INSTALL_CMAKEDIR}")

  # What the config file needs to find the same dependencies again.
  if(TARGET glog::glog)
    set(CPPTRAIN_FIND_GLOG_CONFIG ON)
  else()
    set(CPPTRAIN_FIND_GLOG_CONFIG OFF)
  endif()
  set(config "${CPPTRAIN_BINARY_DIR}/cpptrainConfig.cmake")
  configure_package_config_file("${_CPPTRAIN_PACKAGE_DIR}/cpptrainConfig.cmake.in" "${config}"
                                INSTALL_DESTINATION "${CPPTRAIN_INSTALL_CMAKEDIR}")
  install(FILES "${config}" DESTINATION "${CPPTRAIN_INSTALL_CMAKEDIR}")

  # The protobuf-first include directory (CppTrainDeps.cmake): the generated *.pb.h need the
  # headers of the protobuf they were generated for, ahead of any LibTorch brings.
  install(CODE "
    set(_dir \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_INCLUDEDIR}\")
    string(APPEND _dir \"/cpptrain/protobuf_include_first\")
    file(MAKE_DIRECTORY \"\${_dir}\")
    file(REMOVE \"\${_dir}/google\")
    file(CREATE_LINK \"${Protobuf_INCLUDE_DIR}/google\" \"\${_dir}/google\" SYMBOLIC)
  ")
endfunction()
