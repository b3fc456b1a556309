#!/usr/bin/env bash
# tools/check-layers on the engine as it is (every include runs down or
# across its layer), and on scratch copies that break the rule: an include
# from util/ (the lowest layer) of cli/ (the highest), which must fail
# naming the file, line and layers; and a folder engine/LAYERS does not
# place, which must fail naming it. The same for a nested folder: an
# include from backend/cpu/ of backend/cuda/ (a higher layer) fails, and
# engine/backend/metal, which LAYERS does not place, is refused, as are
# sources of engine/backend/ itself. Then the build's own check
# (cmake/TesseraLayers.cmake, which engine/CMakeLists.txt applies to
# tessera_engine): a scratch project using it builds with the engine as it
# is and fails to build with the upward include, naming it. And the
# capability rule: a TSR_HAS_FIELD in an engine file outside plugin/caps.*
# and plugin/legacy.* fails naming the file and line (one in a comment, or
# in caps.cpp, does not).
#   check_layers_test.sh REPO_ROOT
set -uo pipefail
root=$1
check=$root/tools/check-layers
fail() { echo "FAIL: $*" >&2; exit 1; }

out=$("$check" "$root/engine") || fail "the engine's includes break engine/LAYERS: $out"
echo "$out"

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
fresh() { rm -rf "$scratch/engine" && cp -r "$root/engine" "$scratch/engine"; }
# refused WHAT RC MESSAGE: check-layers on the scratch engine exits RC, naming MESSAGE.
refused() {
  out=$("$check" "$scratch/engine" 2>&1)
  rc=$?
  [ $rc = "$2" ] || fail "$1 gave exit $rc, expected $2: $out"
  echo "$out" | grep -qF -- "$3" || fail "$1 is not named: $out"
}
layer_of() { grep -v '^#' "$root/engine/LAYERS" | grep -v '^ *$' | grep -n -w "$1" | cut -d: -f1; }
fresh
cli_layer=$(($(layer_of cli) - 1))
line=$(($(wc -l <"$scratch/engine/util/text.hpp") + 1))
echo '#include "cli/cli.hpp"' >>"$scratch/engine/util/text.hpp"
refused "an upward include" 1 \
  "util/text.hpp:$line: includes \"cli/...\" (layer $cli_layer), above its folder util/ (layer 0)"

fresh && mkdir "$scratch/engine/newfolder"
refused "an unplaced folder" 2 "does not place folder(s) newfolder"

# Nested folders: backend/cpu and backend/cuda are placed, backend/ only holds them.
cpu_layer=$(($(layer_of backend/cpu) - 1))
cuda_layer=$(($(layer_of backend/cuda) - 1))
[ $cpu_layer -lt $cuda_layer ] || fail "engine/LAYERS no longer puts backend/cpu below backend/cuda"
fresh
cpu_line=$(($(wc -l <"$scratch/engine/backend/cpu/cpu_pool.hpp") + 1))
echo '#include "backend/cuda/device.hpp"' >>"$scratch/engine/backend/cpu/cpu_pool.hpp"
refused "an upward include from a nested folder" 1 \
  "backend/cpu/cpu_pool.hpp:$cpu_line: includes \"backend/cuda/...\" (layer $cuda_layer), above its folder backend/cpu/ (layer $cpu_layer)"

fresh && mkdir "$scratch/engine/backend/metal"
refused "an unplaced nested folder" 2 "does not place folder(s) backend/metal"

fresh && echo 'int stray();' >"$scratch/engine/backend/stray.hpp"
refused "a source of engine/backend/ itself" 2 "does not place folder(s) backend:"
echo "check-layers refuses an upward include and an unplaced folder, nested or not"

# Plugin capabilities are read from plugin/caps, never checked in place.
fresh
hf_line=$(($(wc -l <"$scratch/engine/train/step.cpp") + 1))
echo 'static bool probe(const tsr_offload_vtable *vt) { return TSR_HAS_FIELD(vt, tsr_offload_vtable, stats); }' >>"$scratch/engine/train/step.cpp"
refused "a TSR_HAS_FIELD outside plugin/caps" 1 \
  "train/step.cpp:$hf_line: checks TSR_HAS_FIELD itself; read the plugin's record (plugin/caps.hpp) instead"
fresh
echo '// TSR_HAS_FIELD(vt, tsr_offload_vtable, stats) in a comment is prose' >>"$scratch/engine/train/step.cpp"
echo 'static bool probe2(const tsr_offload_vtable *vt) { return TSR_HAS_FIELD(vt, tsr_offload_vtable, stats); }' >>"$scratch/engine/plugin/caps.cpp"
out=$("$check" "$scratch/engine" 2>&1) || fail "a TSR_HAS_FIELD in a comment or in plugin/caps.cpp was refused: $out"
echo "check-layers refuses a TSR_HAS_FIELD outside plugin/caps and plugin/legacy"

# The build refuses it too.
probe=$scratch/probe
mkdir -p "$probe/src"
echo 'int probe() { return 0; }' >"$probe/src/probe.cpp"
cat >"$probe/src/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.20)
project(layers_probe LANGUAGES CXX)
include($root/cmake/TesseraLayers.cmake)
add_library(probe STATIC probe.cpp)
tessera_check_layers(probe $scratch/engine $check)
CMAKE
fresh
cmake -S "$probe/src" -B "$probe/build" >"$probe/configure.log" 2>&1 || fail "the probe project does not configure: $(tail -20 "$probe/configure.log")"
cmake --build "$probe/build" >"$probe/build1.log" 2>&1 || fail "the probe does not build with the engine as it is: $(tail -20 "$probe/build1.log")"
echo '#include "cli/cli.hpp"' >>"$scratch/engine/util/text.hpp"
if cmake --build "$probe/build" >"$probe/build2.log" 2>&1; then fail "the build accepted an upward include"; fi
grep -q "util/text.hpp:$line: includes \"cli/...\"" "$probe/build2.log" || fail "the failed build does not name the include: $(tail -20 "$probe/build2.log")"
echo "the build fails on an upward include, naming it"
