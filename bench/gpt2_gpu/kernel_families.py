"""Per-step GPU time by kernel family from kernel-trace files (tools/
kernel-trace: start, end, stream, name and, in newer files, the grid per
line; ns), for bench/gpt2_gpu/
kernel_table. Steps are found from the optimizer's kernels: each step ends
with a run of them, so the window from the end of the WARMUP-th run to the
end of the last run holds a whole number of steps.
  python3 kernel_families.py LABEL=TRACE.tsv [LABEL=TRACE.tsv ...] [--warmup N]
Prints a markdown table (ms per step per family, and the GPU's busy share
of the step) and, with --json PATH, writes the figures. --top FAMILY adds,
per trace, the kernels of that family by name: calls and ms per step, so a
gap in a family can be traced to the kernels that make it (with the grid
where the trace has it, so one kernel's calls on other shapes stay apart). --gaps adds,
per trace, where the GPU sat idle inside the steps: idle time by gap size,
and the largest gaps with the kernels either side (a host synchronisation
shows as a large gap after the kernel whose result the host waited for).
"""
import argparse, json, re, sys

# First match wins: attention before matmul (cuDNN's SDPA kernels mention
# gemm-like names), the classifier and layernorm before the elementwise rest.
FAMILIES = [
    ("attention backward", r"(flash|fmha|sdpa|attention|attn).*(bwd|bprop|backward|dq|dk|dv)|(bwd|bprop|backward).*(flash|fmha|sdpa|attention|attn)|dq_cast"),
    ("attention forward", r"flash|fmha|sdpa|attention|attn"),
    ("classifier (softmax, cross-entropy)", r"cross_entropy|crossentropy|ce_rows|ce_total|ce_check|softmax|nll_loss"),
    ("layernorm", r"layer_?norm|layernorm"),
    ("optimizer", r"adam|step_kernel|FusedAdam"),
    ("grad norm, clipping", r"sum_squares|sum_partials|l2norm|L2Norm|norm_kernel|foreach"),
    ("matmul", r"gemm|xmma|nvjet|cutlass|cublas|matmul|splitK|splitk|col_partials|col_finalize"),
    ("embedding", r"embedding|indexSelect|index_select|scatter|gather"),
    # The decoder blocks of Llama-family models (bench/llama_gpu): ours by
    # name; PyTorch's fused Triton kernels stay in "other elementwise".
    ("rmsnorm", r"rms_?norm"),
    ("rope", r"rope|rotary"),
    ("swiglu", r"swiglu|silu"),
    ("dropout", r"dropout"),
    ("gqa expand, group sum", r"expand_(rows_)?kernel|group_sum"),
    ("other elementwise", r"."),
]
OPT = re.compile(r"adam|step_kernel|FusedAdam", re.I)
NORM = dict(FAMILIES)["grad norm, clipping"]  # kernels that may sit inside an optimizer run

def family(name):
    for label, pat in FAMILIES:
        if re.search(pat, name, re.I):
            return label
    return "other elementwise"

def load(path):
    ks = []
    for line in open(path):
        p = line.rstrip("\n").split("\t")
        if len(p) >= 4:
            ks.append((int(p[0]), int(p[1]), p[3], p[4] if len(p) > 4 else ""))
    ks.sort()
    return ks

def step_window(ks, warmup):
    """(start_ns, end_ns, steps): from the end of the warmup-th optimizer run
    to the end of the last one."""
    ends, in_run = [], False
    for s, e, n, g in ks:
        if OPT.search(n):
            if not in_run:
                ends.append(e)
            else:
                ends[-1] = e
            in_run = True
        elif not re.search(NORM, n, re.I):
            in_run = False
    if len(ends) < warmup + 2:
        sys.exit(f"kernel_families: only {len(ends)} optimizer runs in the trace; "
                 f"need more than warmup + 1 = {warmup + 1} (run more steps)")
    return ends[warmup], ends[-1], len(ends) - 1 - warmup

def per_step(ks, warmup):
    lo, hi, steps = step_window(ks, warmup)
    fam, names, busy, last_end, count = {}, {}, 0, lo, 0
    for s, e, n, g in ks:
        if s < lo or s >= hi:
            continue
        f = family(n)
        fam[f] = fam.get(f, 0) + (e - s)
        key = (f, n + (f" [grid {g}]" if g else ""))
        calls, ns = names.get(key, (0, 0))
        names[key] = (calls + 1, ns + e - s)
        count += 1
        # Union of the kernels' intervals: the GPU's busy time, streams overlapping.
        s2 = max(s, last_end)
        if e > s2:
            busy += e - s2
            last_end = e
    span = hi - lo
    return {"steps": steps, "step_ms": span / steps / 1e6, "busy": busy / span,
            "kernels_per_step": count / steps,
            "families": {k: v / steps / 1e6 for k, v in fam.items()},
            "kernels": [{"family": f, "name": n, "calls_per_step": c / steps,
                         "ms_per_step": ns / steps / 1e6}
                        for (f, n), (c, ns) in sorted(names.items(), key=lambda x: -x[1][1])]}

GAP_BUCKETS = [(0, 2e3, "< 2 us"), (2e3, 5e3, "2-5 us"), (5e3, 20e3, "5-20 us"),
               (20e3, 100e3, "20-100 us"), (100e3, float("inf"), ">= 100 us")]

def idle_gaps(ks, warmup):
    """The idle intervals of the GPU inside the step window: (ns, kernel
    before, kernel after), streams merged."""
    lo, hi, steps = step_window(ks, warmup)
    gaps, last_end, last_name = [], lo, None
    for s, e, n, g in ks:
        if s < lo or s >= hi:
            continue
        if s > last_end and last_name is not None:
            gaps.append((s - last_end, last_name, n))
        if e > last_end:
            last_end, last_name = e, n
    return gaps, steps

def gap_table(label, ks, warmup, limit=12):
    gaps, steps = idle_gaps(ks, warmup)
    print(f"\n{label}: idle gaps inside the steps (per step)\n")
    print("| gap size | gaps | idle ms |")
    print("|---|---|---|")
    for lo, hi, name in GAP_BUCKETS:
        sel = [g for g, _, _ in gaps if lo <= g < hi]
        print(f"| {name} | {len(sel) / steps:.1f} | {sum(sel) / steps / 1e6:.3f} |")
    short = lambda n: n if len(n) <= 60 else n[:57] + "..."
    pairs = {}
    for g, a, b in gaps:
        if g >= 5e3:
            n, tot = pairs.get((a, b), (0, 0))
            pairs[(a, b)] = (n + 1, tot + g)
    print(f"\n{label}: gaps of 5 us or more by the kernels either side, most idle first\n")
    print("| after | before | gaps per step | us each | idle ms per step |")
    print("|---|---|---|---|---|")
    for (a, b), (n, tot) in sorted(pairs.items(), key=lambda x: -x[1][1])[:limit]:
        print(f"| `{short(a)}` | `{short(b)}` | {n / steps:.1f} | {tot / n / 1e3:.1f} | "
              f"{tot / steps / 1e6:.3f} |")

def top_table(label, r, fam, limit=25):
    """The kernels of family `fam` in trace `label`, most time first."""
    rows = [k for k in r["kernels"] if k["family"] == fam]
    print(f"\n{label}: {fam} kernels (calls and ms per step, most time first)\n")
    print("| kernel | calls | ms | us per call |")
    print("|---|---|---|---|")
    for k in rows[:limit]:
        name = k["name"] if len(k["name"]) <= 110 else k["name"][:107] + "..."
        print(f"| `{name}` | {k['calls_per_step']:.1f} | {k['ms_per_step']:.3f} | "
              f"{1e3 * k['ms_per_step'] / k['calls_per_step']:.1f} |")
    if len(rows) > limit:
        rest = rows[limit:]
        print(f"| {len(rest)} more | {sum(k['calls_per_step'] for k in rest):.1f} | "
              f"{sum(k['ms_per_step'] for k in rest):.3f} | |")

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("traces", nargs="+", help="LABEL=PATH of a kernel-trace file")
    ap.add_argument("--warmup", type=int, default=5, help="steps skipped at the start (default 5)")
    ap.add_argument("--json", help="also write the figures here")
    ap.add_argument("--top", action="append", default=[], metavar="FAMILY",
                    help="also list this family's kernels by name (repeatable)")
    ap.add_argument("--gaps", action="store_true",
                    help="also show where the GPU idled inside the steps")
    a = ap.parse_args()
    for fam in a.top:
        if fam not in dict(FAMILIES):
            sys.exit(f"kernel_families: --top {fam!r}: not a family; one of: "
                     + ", ".join(f for f, _ in FAMILIES))
    res, traces = {}, {}
    for t in a.traces:
        label, _, path = t.partition("=")
        traces[label] = load(path)
        res[label] = per_step(traces[label], a.warmup)
    labels = list(res)
    print("| kernel family | " + " | ".join(f"{l} ms/step" for l in labels) + " |")
    print("|---|" + "---|" * len(labels))
    for f, _ in FAMILIES:
        if any(f in r["families"] for r in res.values()):
            print(f"| {f} | " + " | ".join(f"{res[l]['families'].get(f, 0):.3f}" for l in labels) + " |")
    print("| **sum of kernels** | " + " | ".join(f"{sum(res[l]['families'].values()):.3f}" for l in labels) + " |")
    print("| step (wall, from the trace) | " + " | ".join(f"{res[l]['step_ms']:.3f}" for l in labels) + " |")
    print("| GPU busy | " + " | ".join(f"{100 * res[l]['busy']:.1f}%" for l in labels) + " |")
    print("| kernels per step | " + " | ".join(f"{res[l]['kernels_per_step']:.0f}" for l in labels) + " |")
    for fam in a.top:
        for l in labels:
            top_table(l, res[l], fam)
    if a.gaps:
        for l in labels:
            gap_table(l, traces[l], a.warmup)
    if a.json:
        json.dump(res, open(a.json, "w"), indent=1)

if __name__ == "__main__":
    main()
