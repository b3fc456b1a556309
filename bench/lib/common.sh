# Sourced by the bench scripts written in bash (issue 24's harness):
#   bench_scratch NAME      prints (and makes) the bench's scratch directory:
#                           $TESSERA_BENCH_SCRATCH/NAME, else ${TMPDIR:-/tmp}/tessera-bench/NAME
#   harness ARGS...         bench/lib/harness.py (sample, figure, plan, env, env-md)
#   check_settings REPS [WINDOW_S]  exits at once where the figure would be
#                           refused at the end (too few samples, too short)
#   json_get FILE KEY...    one value of a JSON file
#   plan_steps PROBE_DIR SECONDS WARMUP   sets plan_steps_n and plan_log_every
#                           from a probe run's metrics.jsonl
# Benches write only there and under bench/results/.
export PYTHONDONTWRITEBYTECODE=1  # nothing written beside the sources
bench_lib="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bench_scratch() {
  local d="${TESSERA_BENCH_SCRATCH:-${TMPDIR:-/tmp}/tessera-bench}/$1"
  mkdir -p "$d" && echo "$d"
}
harness() { python3 "$bench_lib/harness.py" "$@"; }
check_settings() {
  if [ -n "${2:-}" ]; then harness check --reps "$1" --window "$2" || exit 1
  else harness check --reps "$1" || exit 1; fi
}
json_get() {
  python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
for k in sys.argv[2:]:
    d = d[k]
print(d)' "$@"
}
plan_steps() {
  local plan
  plan=$(harness plan "$1/metrics.jsonl" --seconds "$2" --warmup-steps "$3") || return 1
  plan_steps_n=$(python3 -c 'import json, sys; print(json.loads(sys.argv[1])["steps"])' "$plan")
  plan_log_every=$(python3 -c 'import json, sys; print(json.loads(sys.argv[1])["log_every"])' "$plan")
}
