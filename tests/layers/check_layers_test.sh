#!/usr/bin/env bash
# tools/check-layers on the engine as it is (every include runs down or
# across its layer), and on scratch copies that break the rule: an include
# from util/ (the lowest layer) of cli/ (the highest), which must fail
# naming the file, line and layers; and a folder engine/LAYERS does not
# place, which must fail naming it.
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
line=$(($(wc -l <"$scratch/engine/util/text.hpp") + 1))
echo '#include "cli/cli.hpp"' >>"$scratch/engine/util/text.hpp"
out=$("$check" "$scratch/engine" 2>&1)
rc=$?
[ $rc = 1 ] || fail "an upward include gave exit $rc, expected 1: $out"
echo "$out" | grep -q "util/text.hpp:$line: includes \"cli/...\" (layer 6), above its folder util/ (layer 0)" ||
  fail "the upward include is not named: $out"

rm -rf "$scratch/engine" && cp -r "$root/engine" "$scratch/engine" && mkdir "$scratch/engine/newfolder"
out=$("$check" "$scratch/engine" 2>&1)
rc=$?
[ $rc = 2 ] || fail "an unplaced folder gave exit $rc, expected 2: $out"
echo "$out" | grep -q "does not place folder(s) newfolder" || fail "the unplaced folder is not named: $out"
echo "check-layers refuses an upward include and an unplaced folder"
