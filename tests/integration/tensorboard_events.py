#!/usr/bin/env python3
"""tensorboard_events.py TESSERA WORK: trains a small MLP with [monitor]
TensorBoard and CSV outputs on, then reads the event file back with
TensorBoard's own reader (the `tensorboard` package, installed with pip
when missing) and checks that every logged step's loss, lr and throughput,
and the eval loss, are there with the values metrics.jsonl holds; and that
the CSV files hold the same rows.

Prints "SKIPPED: ..." (which ctest reports as skipped) only when the
tensorboard package is missing and pip cannot install it (no network).
"""
import csv
import glob
import importlib
import json
import math
import os
import shutil
import subprocess
import sys

CONFIG = """
[run]
name = "tb"
device = "cpu"
steps = 12
log_every = 3
eval_every = 6
dir = "{run}"

[batch]
micro = 16

[model]
plugin = "mlp"
hidden = [16]

[data.train]
plugin = "synthetic"
samples = 512
shape = [8]
classes = 4

[data.eval]
plugin = "synthetic"
samples = 64
shape = [8]
classes = 4

[optimizer]
plugin = "sgd"
lr = 0.1

[schedule]
type = "warmup"
warmup_steps = 6

[monitor.tensorboard]
enabled = true
output_path = "{out}"
job_name = "job1"

[monitor.csv_monitor]
enabled = true
"""


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def ensure_tensorboard():
    try:
        importlib.import_module("tensorboard")
        return
    except ImportError:
        pass
    print("tensorboard is not installed; pip install tensorboard")
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "tensorboard"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(r.stdout)
    if r.returncode != 0:
        print("SKIPPED: the tensorboard package is missing and pip could not install it "
              "(no network?); install it with 'pip install tensorboard' to run this test")
        sys.exit(0)
    importlib.invalidate_caches()


def close(a, b):
    # The event file holds float32 (simple_value); metrics.jsonl doubles.
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6)


def main():
    tessera, work = sys.argv[1], sys.argv[2]
    ensure_tensorboard()
    from tensorboard.backend.event_processing import event_accumulator

    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    run, out = os.path.join(work, "run"), os.path.join(work, "tb")
    config = os.path.join(work, "tb.toml")
    with open(config, "w") as f:
        f.write(CONFIG.format(run=run, out=out))
    r = subprocess.run([tessera, "run", config], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=120)
    print(r.stdout)
    if r.returncode != 0:
        fail("tessera run exited %d" % r.returncode)
    logdir = os.path.join(out, "job1")
    if "TensorBoard event files in " + logdir not in r.stdout:
        fail("the run does not say where its event files are")

    metrics = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl"))]
    train = [m for m in metrics if m["type"] == "train"]
    evals = [m for m in metrics if m["type"] == "eval"]
    if [m["step"] for m in train] != [3, 6, 9, 12]:
        fail("unexpected logged steps %s" % [m["step"] for m in train])

    files = glob.glob(os.path.join(logdir, "events.out.tfevents.*"))
    if len(files) != 1:
        fail("expected one event file in %s, found %s" % (logdir, files))
    acc = event_accumulator.EventAccumulator(logdir)
    acc.Reload()
    tags = acc.Tags()["scalars"]
    print("tags:", tags)
    for tag, key, rows in (("Train/Samples/train_loss", "loss", train),
                           ("Train/Samples/lr", "lr", train),
                           ("Train/Samples/samples_per_s", "samples_per_s", train),
                           ("Eval/Samples/eval_loss", "eval_loss", evals),
                           ("Eval/Samples/eval_accuracy", "eval_accuracy", evals)):
        if tag not in tags:
            fail("%s: no scalar %s (tags: %s)" % (files[0], tag, tags))
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        want = [(m["step"], m[key]) for m in rows]
        if [s for s, _ in got] != [s for s, _ in want] or \
                not all(close(a, b) for (_, a), (_, b) in zip(got, want)):
            fail("%s: TensorBoard reads %s, metrics.jsonl has %s" % (tag, got, want))
        print("%s: %d steps match metrics.jsonl" % (tag, len(got)))

    # csv_monitor with no output_path: <run dir>/csv_monitor, DeepSpeed's layout.
    path = os.path.join(run, "csv_monitor", "Train_Samples_train_loss.csv")
    with open(path) as f:
        rows = list(csv.reader(f))
    if rows[0] != ["step", "train_loss"]:
        fail("%s: header %s" % (path, rows[0]))
    got = [(int(s), float(v)) for s, v in rows[1:]]
    if got != [(m["step"], m["loss"]) for m in train]:
        fail("%s holds %s" % (path, got))
    print("%s: %d rows match metrics.jsonl" % (path, len(got)))
    print("PASS")


if __name__ == "__main__":
    main()
