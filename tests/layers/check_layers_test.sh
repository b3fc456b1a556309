#!/usr/bin/env bash
# tools/check-layers on the engine as it is (every include runs down or
# across its layer), and on scratch copies that break the rule: an include
# from util/ (the lowest layer) of cli/ (the highest), which must fail
# naming the file, line and layers; and a folder engine/LAYERS does not
# place, which must fail naming it. Then the build's own check
# (cmake/TesseraLayers.cmake, which engine/CMakeLists.txt applies to
# tessera_engine): a scratch project using it builds with the engine as it
# is and fails to build with the upward include, naming it.
#   check_layers_test.sh REPO_ROOT
set -uo pipefail
root=$1
check=$root/tools/check-layers
fail() { echo "FAIL: $*" >&2; exit 1; }

out=$("$check" "$root/engine") || fail "the engine's includes break engine/LAYERS: $out"
echo "$out"

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cp -r "$root/engine" "$scratch/engine"
cli_layer=$(grep -v '^#' "$root/engine/LAYERS" | grep -v '^ *$' | grep -n -w cli | cut -d: -f1)
cli_layer=$((cli_layer - 1))
line=$(($(wc -l <"$scratch/engine/util/text.hpp") + 1))
echo '#include "cli/cli.hpp"' >>"$scratch/engine/util/text.hpp"
out=$("$check" "$scratch/engine" 2>&1)
rc=$?
[ $rc = 1 ] || fail "an upward include gave exit $rc, expected 1: $out"
echo "$out" | grep -q "util/text.hpp:$line: includes \"cli/...\" (layer $cli_layer), above its folder util/ (layer 0)" ||
  fail "the upward include is not named: $out"

rm -rf "$scratch/engine" && cp -r "$root/engine" "$scratch/engine" && mkdir "$scratch/engine/newfolder"
out=$("$check" "$scratch/engine" 2>&1)
rc=$?
[ $rc = 2 ] || fail "an unplaced folder gave exit $rc, expected 2: $out"
echo "$out" | grep -q "does not place folder(s) newfolder" || fail "the unplaced folder is not named: $out"
echo "check-layers refuses an upward include and an unplaced folder"

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
rm -rf "$scratch/engine" && cp -r "$root/engine" "$scratch/engine"
cmake -S "$probe/src" -B "$probe/build" >"$probe/configure.log" 2>&1 || fail "the probe project does not configure: $(tail -20 "$probe/configure.log")"
cmake --build "$probe/build" >"$probe/build1.log" 2>&1 || fail "the probe does not build with the engine as it is: $(tail -20 "$probe/build1.log")"
echo '#include "cli/cli.hpp"' >>"$scratch/engine/util/text.hpp"
if cmake --build "$probe/build" >"$probe/build2.log" 2>&1; then fail "the build accepted an upward include"; fi
grep -q "util/text.hpp:$line: includes \"cli/...\"" "$probe/build2.log" || fail "the failed build does not name the include: $(tail -20 "$probe/build2.log")"
echo "the build fails on an upward include, naming it"
