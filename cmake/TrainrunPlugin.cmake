# trainrun_add_plugin(<name> <sources>...)
# Builds a trainrun plugin: a shared module lib<name>.so linked with the SDK,
# hidden symbols except the plugin descriptor.
function(trainrun_add_plugin name)
  add_library(${name} MODULE ${ARGN})
  target_link_libraries(${name} PRIVATE trainrun::sdk)
  set_target_properties(${name} PROPERTIES
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON
    PREFIX "lib")
endfunction()

# libstdc++ first among a binary's libraries. pip's libtorch.so (2.11, for one)
# exports its own, unversioned copy of std::filesystem (remove_all, create_directory,
# ...); the loader binds a program's calls to the first definition in load
# order, which is LibTorch's when libtorch.so is linked first, and LibTorch's
# remove_all crashes in a program built by another GCC. Naming libstdc++ ahead
# of the objects makes it the first library loaded and searched, for every
# target that links LibTorch (the SDK, plugins, the worker, programs), and for a
# plugin loaded into the worker too.
if(TARGET torch AND CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang" AND CMAKE_SYSTEM_NAME STREQUAL "Linux")
  # By its path: -lstdc++ may find a static libstdc++.a first (a compiler whose
  # own libstdc++.so link points at nothing, say), and so may the name.
  foreach(_trainrun_name IN ITEMS libstdc++.so libstdc++.so.6)
    execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=${_trainrun_name}
      OUTPUT_VARIABLE _trainrun_libstdcxx OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(IS_ABSOLUTE "${_trainrun_libstdcxx}" AND EXISTS "${_trainrun_libstdcxx}")
      break()
    endif()
  endforeach()
  unset(_trainrun_name)
  if(NOT (IS_ABSOLUTE "${_trainrun_libstdcxx}" AND EXISTS "${_trainrun_libstdcxx}"))
    find_library(TRAINRUN_LIBSTDCXX NAMES libstdc++.so.6 HINTS ${CMAKE_CXX_IMPLICIT_LINK_DIRECTORIES})
    set(_trainrun_libstdcxx "${TRAINRUN_LIBSTDCXX}")
  endif()
  get_target_property(_trainrun_torch_link_options torch INTERFACE_LINK_OPTIONS)
  if(IS_ABSOLUTE "${_trainrun_libstdcxx}" AND EXISTS "${_trainrun_libstdcxx}"
     AND NOT _trainrun_torch_link_options MATCHES "libstdc\\+\\+")
    set_property(TARGET torch APPEND PROPERTY INTERFACE_LINK_OPTIONS
      "SHELL:-Wl,--push-state,--no-as-needed ${_trainrun_libstdcxx} -Wl,--pop-state")
  endif()
  unset(_trainrun_torch_link_options)
  unset(_trainrun_libstdcxx)
endif()
