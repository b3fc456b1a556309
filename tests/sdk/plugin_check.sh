#!/usr/bin/env bash
# plugin_check.sh PREFIX WORK: `tessera plugin check` as a model plugin's
# author meets it, with the tessera installed in PREFIX (by install.sh):
#  - the scaffold of `tessera plugin new model`, built out of tree, passes:
#    a line per parameter tensor, every convention ok, exit 0;
#  - a copy whose backward doubles the weight gradient fails, exit 1, and
#    names head.weight (head.bias, untouched, still passes).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/lib.sh"
prefix=$1 work=$2
tessera="$prefix/bin/tessera"
[ -x "$tessera" ] || fail "no tessera in $prefix (the sdk/install test sets it up)"
rm -rf "$work"
mkdir -p "$work"
(cd "$work" && "$tessera" plugin new model gcheck >/dev/null)

build_project() { # SOURCE BUILD
  { cmake -S "$1" -B "$2" -DCMAKE_PREFIX_PATH="$prefix" && cmake --build "$2"; } >"$2.log" 2>&1 ||
    { cat "$2.log" >&2; fail "building $1 failed"; }
}

# check PROJECT BUILD: runs the check from the project; sets $out and $status.
check() {
  set +e
  out=$(cd "$1" && "$tessera" plugin check gcheck.toml --plugin-path "$2" 2>&1)
  status=$?
  set -e
  echo "$out"
}

build_project "$work/gcheck" "$work/build"
check "$work/gcheck" "$work/build"
[ "$status" -eq 0 ] || fail "the scaffold fails its own check (status $status)"
for line in "^  ok    head.weight .* relative error" "^  ok    head.bias " \
  "^  ok    struct sizes" "^  ok    groups .*1 declared, 1 read by forward" \
  "^  ok    grads_done .*once for each of 1 trainable groups" \
  "^  ok    forward .*deterministic" "^passed: 2 parameter tensors"; do
  grep -q "$line" <<<"$out" || fail "no line matching '$line' in the scaffold's check"
done

# The same model with a wrong backward: dW += 2 dy^T x.
cp -r "$work/gcheck" "$work/broken"
sed -i 's/&gw, 1.0f, 1.0f)/\&gw, 2.0f, 1.0f)/' "$work/broken/gcheck.cpp"
grep -q '&gw, 2.0f, 1.0f)' "$work/broken/gcheck.cpp" ||
  fail "could not break the scaffold's backward (did its code change?)"
build_project "$work/broken" "$work/build-broken"
check "$work/broken" "$work/build-broken"
[ "$status" -eq 1 ] || fail "the broken backward passes the check (status $status)"
grep -q "^  FAIL  head.weight " <<<"$out" || fail "head.weight is not marked FAIL"
grep -q "^  ok    head.bias " <<<"$out" || fail "head.bias should still pass"
grep -q "tessera plugin check: failed: head.weight: the analytic gradient" <<<"$out" ||
  fail "the last line does not name head.weight"
echo "plugin check: the scaffold passes, the broken backward fails naming head.weight"
