# tessera_add_plugin: build a loadable tessera plugin library.
#
# Used by tessera's own build (plugins/) and, installed as part of the
# Tessera CMake package (lib/cmake/Tessera/), by plugins built out of tree:
#
#   find_package(Tessera 0.1 REQUIRED)
#   tessera_add_plugin(tsr_optimizer_lion SOURCES lion.c)
#
#   tessera_add_plugin(<target> SOURCES <src>... [LIBS <lib>...]
#                      [OUTPUT_NAME <name>] [NO_INSTALL])
#
# makes <target> a MODULE library, lib<OUTPUT_NAME or target>.so, that
#  - compiles against the SDK headers (target Tessera::sdk) and links LIBS;
#  - hides every symbol (C/C++ visibility hidden, inline functions too) and,
#    through a linker version script, exports only the entry symbol
#    tessera_plugin_library, even the template instances the C++ standard
#    library would otherwise export;
#  - links with -Wl,--no-undefined, so a missing symbol fails the link and
#    not the load;
#  - installs to <prefix>/lib/tessera/plugins, the directory an installed
#    tessera searches next to itself (unless NO_INSTALL).
# In tessera's own build the library lands in build/lib/tessera/plugins
# (TESSERA_PLUGIN_OUTPUT_DIR); out of tree it lands in the current build
# directory: run it with `tessera run CONFIG --plugin-path <build dir>`.
include_guard(GLOBAL)

function(tessera_add_plugin name)
  cmake_parse_arguments(PARSE_ARGV 1 ARG "NO_INSTALL" "OUTPUT_NAME" "SOURCES;LIBS")
  if(ARG_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "tessera_add_plugin(${name}): unknown arguments ${ARG_UNPARSED_ARGUMENTS}"
                        " (expected SOURCES, LIBS, OUTPUT_NAME, NO_INSTALL)")
  endif()
  if(NOT ARG_SOURCES)
    message(FATAL_ERROR "tessera_add_plugin(${name}): no SOURCES given")
  endif()
  if(NOT TARGET Tessera::sdk)
    message(FATAL_ERROR "tessera_add_plugin(${name}): target Tessera::sdk is missing; "
                        "call find_package(Tessera) first")
  endif()
  add_library(${name} MODULE ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE Tessera::sdk ${ARG_LIBS})
  set_target_properties(${name} PROPERTIES
    PREFIX "lib"
    C_VISIBILITY_PRESET hidden
    CXX_VISIBILITY_PRESET hidden
    CUDA_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  if(ARG_OUTPUT_NAME)
    set_target_properties(${name} PROPERTIES OUTPUT_NAME ${ARG_OUTPUT_NAME})
  endif()
  if(TESSERA_PLUGIN_OUTPUT_DIR)
    set_target_properties(${name} PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${TESSERA_PLUGIN_OUTPUT_DIR})
  endif()
  if(NOT APPLE AND NOT WIN32)
    # The version script sits next to this file, in the source tree and
    # once installed.
    set(map "${CMAKE_CURRENT_FUNCTION_LIST_DIR}/tessera_plugin.map")
    target_link_options(${name} PRIVATE -Wl,--no-undefined "-Wl,--version-script=${map}")
    set_property(TARGET ${name} APPEND PROPERTY LINK_DEPENDS ${map})
  endif()
  if(NOT ARG_NO_INSTALL)
    install(TARGETS ${name} LIBRARY DESTINATION lib/tessera/plugins)
  endif()
  set_property(GLOBAL APPEND PROPERTY TESSERA_PLUGIN_TARGETS ${name})
endfunction()
