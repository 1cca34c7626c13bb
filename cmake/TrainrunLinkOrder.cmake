# trainrun_link_libstdcxx_first(<target>)
# Makes the shared libstdc++ the first library of every binary that links
# <target> (an INTERFACE link option, so it reaches what links it).
#
# pip's libtorch.so (2.11) and libtorch_cpu.so (2.11, 2.15) export their own,
# unversioned copy of std::filesystem (remove_all, create_directory, ...). The
# loader binds a call to the first definition in load order, which is
# LibTorch's when LibTorch comes first among a program's libraries, and
# LibTorch 2.11's remove_all crashes in a program built by another GCC. Named
# ahead of the objects, libstdc++ is loaded and searched first; a plugin that
# the worker loads resolves in the worker's scope first, so the worker's order
# covers plugins built any other way.
#
# By its path: -lstdc++ may find a static libstdc++.a first (a compiler whose
# own libstdc++.so link points at nothing, say). Skipped where libstdc++ is
# not the shared C++ library: libc++, -static, -static-libstdc++, cross builds.
function(trainrun_link_libstdcxx_first target)
  if(NOT TARGET ${target} OR NOT CMAKE_CXX_COMPILER OR CMAKE_CROSSCOMPILING
     OR NOT CMAKE_SYSTEM_NAME STREQUAL "Linux"
     OR NOT CMAKE_CXX_COMPILER_ID MATCHES "^(GNU|Clang)$")
    return()
  endif()
  set(flags "${CMAKE_CXX_FLAGS} ${CMAKE_EXE_LINKER_FLAGS} ${CMAKE_SHARED_LINKER_FLAGS}")
  if(flags MATCHES "-stdlib=libc\\+\\+|(^| )-static( |$)|-static-libstdc\\+\\+")
    return()
  endif()
  get_target_property(options ${target} INTERFACE_LINK_OPTIONS)
  if(options MATCHES "libstdc\\+\\+")
    return()  # already
  endif()
  get_property(library GLOBAL PROPERTY TRAINRUN_LIBSTDCXX_PATH)
  if(NOT library)
    separate_arguments(compile_flags UNIX_COMMAND "${CMAKE_CXX_FLAGS}")
    foreach(name IN ITEMS libstdc++.so libstdc++.so.6)
      execute_process(COMMAND ${CMAKE_CXX_COMPILER} ${compile_flags} -print-file-name=${name}
        OUTPUT_VARIABLE library OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
      if(IS_ABSOLUTE "${library}" AND EXISTS "${library}")
        break()
      endif()
      set(library "")
    endforeach()
    if(NOT library)
      find_library(TRAINRUN_LIBSTDCXX NAMES libstdc++.so.6
        HINTS ${CMAKE_CXX_IMPLICIT_LINK_DIRECTORIES})
      set(library "${TRAINRUN_LIBSTDCXX}")
    endif()
    if(NOT library)
      message(WARNING "trainrun: no shared libstdc++ found to link ahead of LibTorch")
      return()
    endif()
    set_property(GLOBAL PROPERTY TRAINRUN_LIBSTDCXX_PATH "${library}")
  endif()
  # C++ links only: nvcc's device link takes no -Wl options.
  set_property(TARGET ${target} APPEND PROPERTY INTERFACE_LINK_OPTIONS
    "$<$<LINK_LANGUAGE:CXX>:SHELL:-Wl,--push-state,--no-as-needed \"${library}\" -Wl,--pop-state>")
endfunction()
