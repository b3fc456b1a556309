# Shared by the SDK tests (tests/sdk/*.sh): source it.

# fail MESSAGE...: print and exit 1.
fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# train_check TESSERA CONFIG RUN_DIR [ARGS...]: runs
#   TESSERA run CONFIG --set run.dir=RUN_DIR --set run.log_every=1 ARGS...
# from CONFIG's directory and fails unless it exits 0 and the last training
# loss it logged (RUN_DIR/metrics.jsonl) is below the first. The output is
# kept in RUN_DIR.log.
train_check() {
  local tessera=$1 config=$2 dir=$3
  shift 3
  rm -rf "$dir" "$dir.log"
  mkdir -p "$(dirname "$dir")"
  if ! (cd "$(dirname "$config")" &&
    "$tessera" run "$config" --set "run.dir=\"$dir\"" --set run.log_every=1 "$@") \
    >"$dir.log" 2>&1; then
    cat "$dir.log" >&2
    fail "tessera run $config $* failed (log above)"
  fi
  local losses
  # `|| true`: under set -e a grep that finds nothing would end the script
  # with no message; the check below says what is missing, with the log.
  losses=$({ grep '"type":"train"' "$dir/metrics.jsonl" || true; } | { grep -o '"loss":[^,}]*' || true; } | cut -d: -f2)
  if [ -z "$losses" ]; then
    cat "$dir.log" >&2
    ls -la "$dir" >&2 || true
    fail "$dir/metrics.jsonl has no training losses (run log above)"
  fi
  local first last steps
  # Parameter expansion, not `echo | head`: under pipefail a head that
  # closes the pipe first would end the script with SIGPIPE and no message.
  first=${losses%%$'\n'*}
  last=${losses##*$'\n'}
  steps=$(wc -l <<<"$losses")
  awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }' ||
    fail "$config: training loss did not go down in $steps steps ($first -> $last)"
  echo "trained $config: $steps steps, loss $first -> $last"
}

# check_exports NM LIB...: every library exports exactly one dynamic symbol,
# tessera_plugin_library.
check_exports() {
  local nm=$1 lib syms
  shift
  for lib in "$@"; do
    [ -f "$lib" ] || fail "$lib: no such file"
    syms=$("$nm" -D --defined-only "$lib" | awk '{ print $NF }' | sort -u)
    [ "$syms" = "tessera_plugin_library" ] ||
      fail "$lib exports $(echo "$syms" | tr '\n' ' ')(allowed: tessera_plugin_library only)"
  done
  echo "exports checked: $# libraries export only tessera_plugin_library"
}
