"""Samples the storage I/O of a process and its descendants until it exits
(bench/offload_params_gpu's NVMe figure):

  iosample.py PID OUT.jsonl [--every S]

Each line: {"time": Unix seconds, "read_bytes": ..., "write_bytes": ...},
summed over PID and every process below it, from /proc/*/io's read_bytes
and write_bytes: what reached the storage layer (O_DIRECT transfers count
in full; reads served from the page cache do not). A descendant that
exits takes its bytes with it, so the bench samples the one training
process, which does its I/O in its own threads.
"""
import argparse
import json
import os
import sys
import time


def children_of():
    kids = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                # The command name is parenthesised and may hold spaces.
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(int(d))
    return kids


def tree_io(pid):
    kids, todo, total = children_of(), [pid], [0, 0]
    while todo:
        p = todo.pop()
        todo += kids.get(p, [])
        try:
            with open(f"/proc/{p}/io") as f:
                for line in f:
                    k, v = line.split(":")
                    if k == "read_bytes":
                        total[0] += int(v)
                    elif k == "write_bytes":
                        total[1] += int(v)
        except (OSError, ValueError):
            continue
    return total


def alive(pid):
    """Running, not a zombie waiting for its parent."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("pid", type=int)
    p.add_argument("out")
    p.add_argument("--every", type=float, default=0.2, help="seconds between samples")
    a = p.parse_args(argv)
    if not os.path.exists(f"/proc/{a.pid}/io"):
        print(f"iosample.py: no /proc/{a.pid}/io (has process {a.pid} exited?)", file=sys.stderr)
        return 1
    with open(a.out, "w") as f:
        while alive(a.pid):
            r, w = tree_io(a.pid)
            f.write(json.dumps({"time": time.time(), "read_bytes": r, "write_bytes": w}) + "\n")
            f.flush()
            time.sleep(a.every)
    return 0


if __name__ == "__main__":
    sys.exit(main())
