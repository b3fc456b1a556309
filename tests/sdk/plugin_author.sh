#!/usr/bin/env bash
# plugin_author.sh PREFIX WORK: a model plugin's author, end to end, with the
# tessera installed in PREFIX (by install.sh) and nothing else:
#  - `tessera plugin new model author`, out of tree;
#  - built with find_package(Tessera) (the scaffold's CMakeLists.txt), and
#    again with nothing but c++ and pkg-config; each library exports only
#    its entry symbol and loads;
#  - `tessera plugin check` passes the scaffold: a line per parameter
#    tensor, every convention ok, exit 0 (for both builds);
#  - trained 20 steps on 1 rank (the CMake build) and on 2 (the pkg-config
#    build), the loss going down each time;
#  - the 2-rank run evaluated with its own config.toml, to the accuracy
#    its summary.json reports;
#  - a copy whose backward doubles the weight gradient fails the check,
#    exit 1, naming head.weight (head.bias, untouched, still passes); its
#    rebuild with a warning (-Werror) fails and leaves no library to check;
#    one that never calls grads_done fails naming the call to add.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/lib.sh"
prefix=$1 work=$2
tessera="$prefix/bin/tessera"
[ -x "$tessera" ] || fail "no tessera in $prefix (the sdk/install test sets it up)"
rm -rf "$work"
mkdir -p "$work"
(cd "$work" && "$tessera" plugin new model author >/dev/null)
project="$work/author"
config="$project/author.toml"

build_cmake() { # SOURCE BUILD
  { cmake -S "$1" -B "$2" -DCMAKE_PREFIX_PATH="$prefix" && cmake --build "$2"; } >"$2.log" 2>&1 ||
    { cat "$2.log" >&2; fail "building $1 with CMake failed"; }
}

# The flags docs/plugins.md gives for other build systems, on the C++
# scaffold: the same library tessera_add_plugin makes.
build_pkg_config() { # SOURCE BUILD
  mkdir -p "$2"
  # shellcheck disable=SC2046
  { c++ -std=c++20 -O2 -Wall -Wextra -Werror $(pkg-config --cflags tessera) \
    $(pkg-config --variable=plugin_cflags tessera) -c "$1/author.cpp" -o "$2/author.o" &&
    c++ -o "$2/libtsr_model_author.so" "$2/author.o" \
      $(pkg-config --variable=plugin_ldflags tessera); } >"$2.log" 2>&1 ||
    { cat "$2.log" >&2; fail "building $1 with pkg-config failed"; }
}

# check PROJECT BUILD: runs the check from the project; sets $out and $status.
check() {
  set +e
  out=$(cd "$1" && "$tessera" plugin check author.toml --plugin-path "$2" 2>&1)
  status=$?
  set -e
  echo "$out"
}

build_cmake "$project" "$work/build-cmake"
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
build_pkg_config "$project" "$work/build-pc"
for lib in "$work/build-cmake/libtsr_model_author.so" "$work/build-pc/libtsr_model_author.so"; do
  check_exports "${NM:-nm}" "$lib"
  shown=$("$tessera" plugins show author --plugin-path "$(dirname "$lib")")
  grep -q "^model author" <<<"$shown" ||
    fail "$lib does not load"
done
echo "built with find_package and with pkg-config; both load"

check "$project" "$work/build-cmake"
[ "$status" -eq 0 ] || fail "the scaffold fails its own check (status $status)"
for line in "^  ok    head.weight .* relative error" "^  ok    head.bias " \
  "^  ok    struct sizes" "^  ok    groups .*1 declared, 1 read by forward" \
  "^  ok    grads_done .*once for each of 1 trainable groups" \
  "^  ok    forward .*deterministic" "^passed: 2 parameter tensors"; do
  grep -q "$line" <<<"$out" || fail "no line matching '$line' in the scaffold's check"
done
check "$project" "$work/build-pc" >/dev/null
[ "$status" -eq 0 ] || fail "the pkg-config build fails the check (status $status): $out"

train_check "$tessera" "$config" "$work/run1" --plugin-path "$work/build-cmake" --set run.steps=20
train_check "$tessera" "$config" "$work/run2" -n 2 --plugin-path "$work/build-pc" \
  --set run.steps=20

# The run's own config.toml (resolved for 2 ranks) evaluates its checkpoint.
own="$work/run2/config.toml"
[ -f "$own" ] || fail "the 2-rank run wrote no config.toml"
set +e
out=$(cd "$work" && "$tessera" eval "$own" --ckpt "$work/run2/ckpt" --plugin-path "$work/build-pc" 2>&1)
status=$?
set -e
[ "$status" -eq 0 ] || { echo "$out" >&2; fail "eval on the run's own config.toml failed"; }
want=$(grep -o '"eval_accuracy": *[0-9.e-]*' "$work/run2/summary.json" | cut -d: -f2 | tr -d ' ')
[ -n "$want" ] || fail "the 2-rank run's summary.json has no eval_accuracy"
want=$(awk -v a="$want" 'BEGIN { printf "%.4f", a }')
grep -q "^eval | loss .* | accuracy $want | 10000 samples" <<<"$out" ||
  fail "eval on config.toml does not report the run's accuracy $want: $out"
echo "eval on the run's own config.toml: accuracy $want, as the run's summary says"

# The same model with a wrong backward: dW += 2 dy^T x.
cp -r "$project" "$work/broken"
sed -i 's/&gw, 1.0f, 1.0f)/\&gw, 2.0f, 1.0f)/' "$work/broken/author.cpp"
grep -q '&gw, 2.0f, 1.0f)' "$work/broken/author.cpp" ||
  fail "could not break the scaffold's backward (did its code change?)"
build_cmake "$work/broken" "$work/build-broken"
check "$work/broken" "$work/build-broken"
[ "$status" -eq 1 ] || fail "the broken backward passes the check (status $status)"
grep -q "^  FAIL  head.weight " <<<"$out" || fail "head.weight is not marked FAIL"
grep -q "^  ok    head.bias " <<<"$out" || fail "head.bias should still pass"
grep -q "tessera plugin check: failed: head.weight: the analytic gradient" <<<"$out" ||
  fail "the last line does not name head.weight"

# A rebuild that fails (-Werror: an unused variable) leaves no library:
# the check then says so instead of checking the last good build.
lib="$work/build-broken/libtsr_model_author.so"
[ -f "$lib" ] || fail "the broken build left no $lib"
printf '\nstatic int unused_for_the_test() { int x = 1; return 0; }\n' >>"$work/broken/author.cpp"
if cmake --build "$work/build-broken" >"$work/build-broken-werror.log" 2>&1; then
  fail "a build with a warning passed (-Werror?)"
fi
[ ! -e "$lib" ] || fail "a failed build left the previous $lib to be checked"
check "$work/broken" "$work/build-broken" >/dev/null
[ "$status" -ne 0 ] || fail "plugin check passed with no library built"
grep -q "author" <<<"$out" || fail "plugin check does not name the missing plugin: $out"

# And one that forgets to say its group is done: the convention is named,
# with the call to add.
cp -r "$project" "$work/no_done"
perl -0pi -e 's/(backward_linear\(step, head, x\.get\(\), dz\.get\(\), nullptr\);\n)\s*\/\/[^\n]*\n\s*check\(host->grads_done\(step, 0\)\);\n/$1/' \
  "$work/no_done/author.cpp"
[ "$(grep -c 'grads_done(step, 0)' "$work/no_done/author.cpp")" -eq 1 ] ||
  fail "could not remove the scaffold's last grads_done (did its code change?)"
build_cmake "$work/no_done" "$work/build-no_done"
check "$work/no_done" "$work/build-no_done"
[ "$status" -eq 1 ] || fail "a backward without grads_done passes the check (status $status)"
grep -q "^  FAIL  grads_done .*backward never calls grads_done for group 0" <<<"$out" ||
  fail "the missing grads_done is not named"
grep -q "tessera plugin check: failed: grads_done: .*call host->grads_done(step, 0)" <<<"$out" ||
  fail "the last line does not say which call to add"

echo "plugin author: new, built two ways, checked, trained on 1 and 2 ranks, evaluated from"
echo "config.toml; a broken backward fails the check naming head.weight, a missing grads_done"
echo "naming the call"
