#!/usr/bin/env bash
# plugin_project.sh PREFIX WORK scaffold KIND
# plugin_project.sh PREFIX WORK example SOURCE_DIR CONFIG
#
# Builds one plugin project out of tree against the tessera installed in
# PREFIX (by install.sh), as a plugin author would:
#   cmake -S <project> -B <build> -DCMAKE_PREFIX_PATH=PREFIX && cmake --build <build>
# checks the library exports only tessera_plugin_library, and trains 20
# steps with the project's config (tessera run CONFIG --plugin-path <build>),
# requiring the training loss to go down.
#  scaffold: the project is `tessera plugin new KIND sdk_KIND`, fresh.
#  example:  the project is SOURCE_DIR (examples/...), built in WORK.
# With COMPARE_OFFLOAD_NONE=1 (the host_offload example), the same 20 steps
# are trained again with the shipped offload backend `none`, and the losses
# must be identical: the custom backend really runs the optimizer it is given.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/lib.sh"
prefix=$1 work=$2 mode=$3
tessera="$prefix/bin/tessera"
[ -x "$tessera" ] || fail "no tessera in $prefix (the sdk/install test sets it up)"
rm -rf "$work"
mkdir -p "$work"

case "$mode" in
  scaffold)
    kind=$4
    name="sdk_$kind"
    (cd "$work" && "$tessera" plugin new "$kind" "$name")
    project="$work/$name"
    config="$project/$name.toml"
    for f in CMakeLists.txt "$name.cpp" "$name.toml" README.md .gitignore; do
      [ -f "$project/$f" ] || fail "tessera plugin new $kind did not write $f"
    done
    ;;
  example)
    project=$4
    config=$5
    ;;
  *) fail "unknown mode '$mode'" ;;
esac

build="$work/build"
cmake -S "$project" -B "$build" -DCMAKE_PREFIX_PATH="$prefix" >"$work/configure.log" 2>&1 ||
  { cat "$work/configure.log" >&2; fail "configuring $project failed"; }
cmake --build "$build" >"$work/build.log" 2>&1 ||
  { cat "$work/build.log" >&2; fail "building $project failed"; }
libs=("$build"/lib*.so)
[ ${#libs[@]} -eq 1 ] || fail "expected one plugin library in $build, found ${libs[*]}"
echo "built ${libs[0]}"
check_exports "${NM:-nm}" "${libs[0]}"

# It loads on the first try: listed, nothing refused.
listing=$("$tessera" plugins --plugin-path "$build")
grep -q "$build/" <<<"$listing" || fail "tessera does not list the plugin in $build: $listing"
if grep -q "^refused" <<<"$listing"; then fail "refused: $listing"; fi

train_check "$tessera" "$config" "$work/run" --plugin-path "$build" --set run.steps=20

if [ "${COMPARE_OFFLOAD_NONE:-0}" = 1 ]; then
  # The same run through the shipped backend: the example's [offload] keys
  # are its own, so drop them.
  sed -e '/^\[offload\]/,$d' "$config" >"$work/with_none.toml"
  printf '[offload]\nplugin = "none"\n' >>"$work/with_none.toml"
  train_check "$tessera" "$work/with_none.toml" "$work/run_none" --set run.steps=20
  a=$(grep '"type":"train"' "$work/run/metrics.jsonl" | grep -o '"loss":[^,}]*')
  b=$(grep '"type":"train"' "$work/run_none/metrics.jsonl" | grep -o '"loss":[^,}]*')
  [ "$a" = "$b" ] || fail "losses differ from offload none:
$(paste <(echo "$a") <(echo "$b"))"
  echo "identical losses to offload 'none' over 20 steps"
fi
