# Writes OUT, a C++ source holding every file under TEMPLATE_DIR as a raw
# string literal: the templates of `tessera plugin new`, embedded in the
# binary (engine/CMakeLists.txt runs this at build time).
#   cmake -DTEMPLATE_DIR=<dir> -DOUT=<file.cpp> -P EmbedTemplates.cmake
if(NOT TEMPLATE_DIR OR NOT OUT)
  message(FATAL_ERROR "EmbedTemplates.cmake: set TEMPLATE_DIR and OUT")
endif()
file(GLOB_RECURSE files RELATIVE "${TEMPLATE_DIR}" "${TEMPLATE_DIR}/*")
list(SORT files)
set(delim "TSR_TEMPLATE")
set(body "")
foreach(f IN LISTS files)
  file(READ "${TEMPLATE_DIR}/${f}" text)
  string(FIND "${text}" ")${delim}\"" clash)
  if(NOT clash EQUAL -1)
    message(FATAL_ERROR "EmbedTemplates.cmake: ${f} contains the delimiter )${delim}\"")
  endif()
  string(APPEND body "    {\"${f}\", R\"${delim}(${text})${delim}\"},\n")
endforeach()
list(LENGTH files count)
set(source "// Generated from engine/cli/templates by cmake/EmbedTemplates.cmake: do not edit.
#include \"cli/plugin_templates.hpp\"

namespace tessera::cli {

const TemplateFile kTemplateFiles[] = {
${body}};
const size_t kNumTemplateFiles = ${count};

}  // namespace tessera::cli
")
file(WRITE "${OUT}" "${source}")
