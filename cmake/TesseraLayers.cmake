# tessera_check_layers(TARGET ENGINE_DIR CHECKER): before TARGET compiles,
# the build runs CHECKER (tools/check-layers) over ENGINE_DIR, so an include
# from a lower engine folder of a higher one (engine/LAYERS) fails the build,
# naming the file, the line and both layers. It reruns whenever an engine
# source, a header, LAYERS or the checker changes.
function(tessera_check_layers target engine_dir checker)
  find_package(Python3 REQUIRED COMPONENTS Interpreter)
  file(GLOB_RECURSE files CONFIGURE_DEPENDS ${engine_dir}/*.cpp ${engine_dir}/*.hpp
       ${engine_dir}/*.cu ${engine_dir}/*.cuh ${engine_dir}/*.h)
  set(stamp ${CMAKE_CURRENT_BINARY_DIR}/${target}_layers.ok)
  add_custom_command(OUTPUT ${stamp}
    COMMAND Python3::Interpreter ${checker} ${engine_dir}
    COMMAND ${CMAKE_COMMAND} -E touch ${stamp}
    DEPENDS ${files} ${engine_dir}/LAYERS ${checker}
    COMMENT "Checking the engine's include layers (engine/LAYERS)"
    VERBATIM)
  add_custom_target(${target}_layers DEPENDS ${stamp})
  add_dependencies(${target} ${target}_layers)
endfunction()
