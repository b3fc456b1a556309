#!/usr/bin/env bash
# plugin_new_cli.sh TESSERA WORK: `tessera plugin new` as a command: its help,
# its refusals (exit 2 for usage, 1 for the rest, with a message), DIR,
# --force. Building and training what it writes is sdk/scaffold/*.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
tessera=$1 work=$2
rm -rf "$work"
mkdir -p "$work"
cd "$work"

# expect STATUS PATTERN CMD...: CMD exits STATUS and its output matches PATTERN.
expect() {
  local want=$1 pattern=$2 out status=0
  shift 2
  out=$("$@" 2>&1) || status=$?
  [ "$status" = "$want" ] || fail "$*: exit $status, expected $want: $out"
  grep -qE -- "$pattern" <<<"$out" || fail "$*: output does not match '$pattern': $out"
}

expect 0 "usage: tessera plugin new KIND NAME" "$tessera" plugin --help
expect 0 "usage: tessera plugin new KIND NAME" "$tessera" plugin new --help
expect 0 "plugin new K N" "$tessera" --help
expect 2 "expected 'new KIND NAME" "$tessera" plugin
expect 2 "unknown subcommand 'list'.*tessera plugins" "$tessera" plugin list
expect 2 "expected KIND NAME" "$tessera" plugin new model
expect 2 "unknown kind 'widget' \(one of model, dataset, sampler, optimizer, offload" \
  "$tessera" plugin new widget w
expect 2 "'My-Model' is not a plugin name" "$tessera" plugin new model My-Model
expect 1 "already has an optimizer plugin named 'adam'" "$tessera" plugin new optimizer adam
expect 1 "already has a model plugin named 'mlp'" "$tessera" plugin new model mlp

# DIR, and no overwriting without --force.
expect 0 "created sampler plugin 'blocks2' in sub/dir" "$tessera" plugin new sampler blocks2 sub/dir
for f in CMakeLists.txt blocks2.cpp blocks2.toml README.md .gitignore; do
  [ -f "sub/dir/$f" ] || fail "plugin new did not write sub/dir/$f"
done
grep -q '"blocks2"' sub/dir/blocks2.cpp || fail "the source does not name the plugin"
grep -q 'tessera_add_plugin(tsr_sampler_blocks2 ' sub/dir/CMakeLists.txt ||
  fail "CMakeLists.txt does not name the target"
if grep -q '@[A-Z_]*@' sub/dir/*.* sub/dir/CMakeLists.txt; then
  fail "unreplaced template placeholders: $(grep -l '@[A-Z_]*@' sub/dir/*)"
fi
echo "// edited" >>sub/dir/blocks2.cpp
expect 1 "sub/dir/CMakeLists.txt already exists.*--force" "$tessera" plugin new sampler blocks2 sub/dir
grep -q "// edited" sub/dir/blocks2.cpp || fail "a refused plugin new changed an existing file"
expect 0 "created" "$tessera" plugin new sampler blocks2 sub/dir --force
if grep -q "// edited" sub/dir/blocks2.cpp; then fail "--force did not overwrite"; fi
touch a_file
expect 1 "a_file exists and is not a directory" "$tessera" plugin new model m a_file
# The next steps of a model plugin name the check, between the build and the run.
next=$("$tessera" plugin new model m2 | sed -n '/^next:/,$p' | grep -n 'cmake --build\|plugin check m2.toml --plugin-path build\|tessera run m2.toml' | cut -d: -f1 | tr '\n' ' ')
[ "$next" = "4 5 6 " ] || fail "plugin new model: the next steps do not go build, plugin check, run (lines $next)"
# Hyphens are allowed in names; the CMake target gets underscores.
expect 0 "created" "$tessera" plugin new dataset my-data
grep -q 'tessera_add_plugin(tsr_dataset_my_data ' my-data/CMakeLists.txt ||
  fail "hyphenated name: $(grep tessera_add_plugin my-data/CMakeLists.txt)"
echo "tessera plugin new: help, refusals, DIR and --force behave"
