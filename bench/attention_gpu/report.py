"""bench/attention_gpu's result file from its scratch directory
(bench/attention_gpu/run writes it; tests/bench feeds it made-up logs):

  report.py WORK REPS DTYPE SHAPE...        (SHAPE: B,T,H,D)

WORK holds attn-SHAPE.log (attention_bench --reps --seconds: a line
'sample {"impl", "pass", "calls", "seconds"}' a window), attn-SHAPE.rc (its
exit status) and env-before.json / env-after.json. Each figure: the median
(min-max) of the windows' calls per second (bench/lib/harness.py), shown as
ms per call and TFLOP/s. Exits 1 when a figure is refused (the file says
why).
"""
import datetime
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import harness  # noqa: E402
import machine  # noqa: E402
from harness import BenchError  # noqa: E402

IMPLS = (("native", "tessera native"), ("cudnn", "cuDNN"))
PASSES = ("forward", "backward")


def fmt_ms(f):
    """ms per call from a figure of calls per second: its min is the slowest."""
    s = f"{1e3 / f.median:.3f} ({1e3 / f.hi:.3f}-{1e3 / f.lo:.3f})"
    return s + (f" **noisy {100 * f.spread:.0f}%**" if f.noisy else "")


def shape_section(work, reps, dtype, shape, refused):
    B, T, H, D = (int(x) for x in shape.split(","))
    # Causal: half the 4 B H T^2 D of full attention forward; backward 2.5x
    # (attention_bench's count).
    flop = {"forward": 2.0 * B * H * T * T * D, "backward": 5.0 * B * H * T * T * D}
    log = os.path.join(work, f"attn-{shape}.log")
    out = [f"## B={B}, T={T}, H={H}, D={D} ({dtype})", ""]
    try:
        with open(log) as f:
            text = f.read()
    except OSError as e:
        refused.append(f"{shape}: {log}: {e.strerror}")
        return out + ["not run (see below)", ""]
    samples = {}
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("sample "):
            try:
                j = json.loads(line[len("sample "):])
                s = harness.Sample(j["calls"] / j["seconds"], j["seconds"], j["calls"],
                                   f"{log}:{n}")
            except (ValueError, KeyError, ZeroDivisionError, TypeError):
                refused.append(f"{shape}: {log}:{n}: not a sample line")
                continue
            samples.setdefault((j["impl"], j["pass"]), []).append(s)
    figs, status = {}, {}
    for impl, label in IMPLS:
        m = re.search(rf"^{impl}\s+(\(unavailable: .*\)|failed .*)$", text, re.M)
        if m:  # the bench said why it has no figure
            status[impl] = m.group(1)
            refused.append(f"{shape} {label}: {m.group(1)}")
            continue
        for p in PASSES:
            got = samples.get((impl, p), [])
            if not got:
                refused.append(f"{shape} {label} {p}: no sample lines in {log}")
                continue
            try:
                for s in got:
                    harness.check_rate(s.rate, s.seconds, source=s.source)
                figs[impl, p] = harness.figure(got)
            except BenchError as e:
                refused.append(f"{shape} {label} {p}: {e}")
    out += ["| implementation | forward ms | backward ms | forward TFLOP/s | backward TFLOP/s |",
            "|---|---|---|---|---|"]
    for impl, label in IMPLS:
        if impl in status:
            out.append(f"| {label} | {status[impl]} | | | |")
            continue
        cells = [fmt_ms(figs[impl, p]) if (impl, p) in figs else "refused (below)"
                 for p in PASSES]
        cells += [harness.fmt_figure(figs[impl, p], flop[p] / 1e12) if (impl, p) in figs else ""
                  for p in PASSES]
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    out.append("")
    for p in PASSES:
        if ("native", p) in figs and ("cudnn", p) in figs:
            r = harness.ratio(figs["native", p], figs["cudnn", p])
            out.append(f"- {p}: native / cuDNN = {harness.fmt_ratio(r)} (calls per second, "
                       "median over median)")
    m = re.search(r"^cudnn vs native: (.*)$", text, re.M)
    if m:
        out.append(f"- cuDNN against native: {m.group(1)} (relative L2 difference)")
    rc_path = os.path.join(work, f"attn-{shape}.rc")
    rc = open(rc_path).read().strip() if os.path.exists(rc_path) else "?"
    if rc not in ("0", "?"):
        tail = [l for l in text.splitlines() if l.strip()][-3:]
        refused.append(f"{shape}: attention_bench exited {rc}: " + " / ".join(tail))
    dev = re.search(r"^device: (.*)$", text, re.M)
    cudnn = re.search(r"^cudnn: (.*)$", text, re.M)
    out += [f"- device: {dev.group(1) if dev else '?'}; cuDNN: {cudnn.group(1) if cudnn else '?'}",
            ""]
    return out


def main(argv):
    if len(argv) < 5:
        print(__doc__, file=sys.stderr)
        return 2
    work, reps, dtype, shapes = argv[1], int(argv[2]), argv[3], argv[4:]
    refused = []
    out = [f"# bench/attention_gpu — {datetime.date.today().isoformat()}", "",
           "Causal attention on one GPU, forward and backward, the engine's flash kernels "
           "(native) against cuDNN's fused flash attention, q/k/v as views into a fused "
           "[B, T, 3, H, D] buffer (GPT-2's layout). Each figure is the median (min-max) of "
           f"{reps} windows of at least {harness.MIN_WINDOW_S:g} s of back-to-back calls, "
           "timed by CUDA events after a warm-up that builds cuDNN's plans; the repetitions "
           "go round the implementations in turn (bench/lib/harness.py). A figure whose "
           f"spread exceeds {100 * harness.NOISY_SPREAD:.0f}% is marked noisy. TFLOP/s at "
           "the causal count: 2 B H T^2 D forward, 2.5x that backward.", ""]
    for shape in shapes:
        out += shape_section(work, reps, dtype, shape, refused)
    for e in refused:
        out.append(f"- refused: {e}")
    if refused:
        out.append("")
    before = harness.load_json(os.path.join(work, "env-before.json"))
    after_p = os.path.join(work, "env-after.json")
    after = harness.load_json(after_p) if os.path.exists(after_p) else None
    out += machine.markdown(before, after)
    print("\n".join(out))
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
