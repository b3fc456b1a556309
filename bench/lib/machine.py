"""What moves a bench's figures, recorded in its result file (issue 24):
the commit, the CPU and its cores, the load, the BLAS library and the
kernel it runs, the OpenBLAS variables, the GPU, driver and CUDA, and the
torch and DeepSpeed versions. Every probe is best effort: what cannot be
found reads "not found" (or is left out), it never stops a bench.

  snapshot(tessera_bin, python) -> dict (JSON-able)
  markdown(before, after) -> lines of the result file's environment section
"""
import ctypes
import datetime
import json
import os
import platform
import re
import resource
import subprocess
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BLAS_VARS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
             "MKL_NUM_THREADS", "MKL_ENABLE_INSTRUCTIONS", "MKL_DEBUG_CPU_TYPE")


def _read(path):
    with open(path) as f:
        return f.read()


def _run(cmd, timeout=60, env=None):
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout if r.returncode == 0 else None


def load():
    """The load averages (1, 5, 15 minutes) and the runnable processes now."""
    try:
        f = _read("/proc/loadavg").split()
        return {"load1": float(f[0]), "load5": float(f[1]), "load15": float(f[2]),
                "running": f[3], "time": datetime.datetime.now(datetime.timezone.utc).isoformat(
                    timespec="seconds")}
    except (OSError, IndexError, ValueError):
        one, five, fifteen = os.getloadavg()
        return {"load1": one, "load5": five, "load15": fifteen}


def cpu_times():
    """The machine's CPU seconds so far, all CPUs together, from /proc/stat:
    busy (user, nice, system, irq, softirq) and steal (time the hypervisor
    gave the virtual CPUs to someone else), with this process's and its
    waited-for children's own CPU seconds; None where unreadable."""
    try:
        v = [int(x) for x in _read("/proc/stat").splitlines()[0].split()[1:]]
        hz = float(os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None
    own = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        r = resource.getrusage(who)
        own += r.ru_utime + r.ru_stime
    return {"busy": (v[0] + v[1] + v[2] + v[5] + v[6]) / hz,
            "steal": (v[7] if len(v) > 7 else 0) / hz, "own": own,
            "wall": time.monotonic(), "cpus": os.cpu_count() or 1}


def cpu_share(t0, t1):
    """What else the CPUs did between two cpu_times(): {"others": the share
    of the machine's CPU time that processes other than this one and its
    children used, "steal": the share the hypervisor took}, or None."""
    if not t0 or not t1:
        return None
    span = (t1["wall"] - t0["wall"]) * t1["cpus"]
    if span <= 0:
        return None
    others = (t1["busy"] - t0["busy"]) - (t1["own"] - t0["own"])
    return {"others": max(0.0, others) / span, "steal": max(0.0, t1["steal"] - t0["steal"]) / span}


def cpu():
    info = {}
    try:
        text = _read("/proc/cpuinfo")
    except OSError:
        text = ""
    for key, name in (("model name", "model"), ("cpu family", "family"), ("model", "model_id"),
                      ("stepping", "stepping")):
        m = re.search(rf"^{key}\s*:\s*(.*)$", text, re.M)
        if m:
            info[name] = m.group(1).strip()
    m = re.search(r"^flags\s*:\s*(.*)$", text, re.M)
    flags = set(m.group(1).split()) if m else set()
    info["isa"] = " ".join(f for f in ("avx512f", "avx512_bf16", "amx_tile", "avx2", "fma", "f16c")
                           if f in flags)
    info["hypervisor"] = "hypervisor" in flags
    info["cores_online"] = os.cpu_count()
    try:
        info["cores_allowed"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        info["cores_allowed"] = os.cpu_count()
    try:
        kb = int(re.search(r"MemTotal:\s*(\d+)", _read("/proc/meminfo")).group(1))
        info["memory_gib"] = round(kb / 2**20, 1)
    except (OSError, AttributeError):
        pass
    return info


def git():
    commit = (_run(["git", "-C", ROOT, "rev-parse", "--short=10", "HEAD"]) or "").strip()
    dirty = _run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"])
    return {"commit": commit or "not found",
            "dirty": bool(dirty.strip()) if dirty is not None else None}


def openblas(tessera_bin=None):
    """The OpenBLAS tessera links, and the kernel it picks on this CPU under
    this environment (openblas_get_corename in this process: the same
    library, CPU and OPENBLAS_CORETYPE as the engine's)."""
    path = None
    if tessera_bin:
        out = _run(["ldd", tessera_bin]) or ""
        m = re.search(r"(\S*lib(?:open)?blas\S*\.so\S*) => (\S+)", out)
        if m:
            path = os.path.realpath(m.group(2))
    out = {"library": path or "not found (tessera binary not given or not linked to a BLAS)"}
    for name in ([path] if path else []) + ["libopenblas.so.0"]:
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        for fn, key in (("openblas_get_corename", "coretype"), ("openblas_get_config", "config")):
            try:
                f = getattr(lib, fn)
            except AttributeError:
                continue
            f.restype = ctypes.c_char_p
            out[key] = f().decode()
        if path is None:
            out["library"] = f"{name} (the system's; no tessera binary given)"
        break
    out["env"] = {k: os.environ[k] for k in BLAS_VARS if k in os.environ}
    return out


TORCH_PROBE = r"""
import json, os, re, sys
out = {}
try:
    import torch
    cfg = torch.__config__.show()
    m = re.search(r"BLAS_INFO=(\w+)", cfg)
    mkl = re.search(r"Math Kernel Library Version ([\d.]+)", cfg)
    out = {"version": torch.__version__, "cuda": torch.version.cuda,
           "blas": m.group(1) if m else "?", "mkl": mkl.group(1) if mkl else None,
           "mkldnn": torch.backends.mkldnn.is_available(),
           "cpu_capability": torch.backends.cpu.get_cpu_capability(),
           "threads": torch.get_num_threads()}
    a = torch.randn(64, 64)
    (a @ a).sum().item()  # MKL_VERBOSE names the code path of this product
except Exception as e:
    out = {"error": f"{type(e).__name__}: {e}"}
try:
    import deepspeed
    out["deepspeed"] = deepspeed.__version__
except Exception:
    pass
print("TORCH_PROBE " + json.dumps(out))
"""


def torch_info(python):
    env = dict(os.environ, MKL_VERBOSE="1")
    try:
        r = subprocess.run([python, "-c", TORCH_PROBE], capture_output=True, text=True,
                           timeout=300, env=env)
    except (OSError, subprocess.SubprocessError) as e:
        return {"error": str(e)}
    text = r.stdout + r.stderr
    m = re.search(r"^TORCH_PROBE (.*)$", r.stdout, re.M)
    out = json.loads(m.group(1)) if m else {"error": (text.strip().splitlines() or ["?"])[-1]}
    v = re.search(r"MKL_VERBOSE (?:oneMKL|Intel\(R\) MKL) ([^\n]*)", text)
    if v:
        out["mkl_code_path"] = v.group(1).strip()
    out["python"] = python
    return out


def gpu():
    q = _run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
              "--format=csv,noheader"], timeout=30)
    if not q:
        return None
    head = _run(["nvidia-smi"], timeout=30) or ""
    m = re.search(r"CUDA Version:\s*([\d.]+)", head)
    nvcc = _run(["nvcc", "--version"], timeout=30) or ""
    n = re.search(r"release ([\d.]+)", nvcc)
    return {"gpus": [x.strip() for x in q.strip().splitlines()],
            "driver_cuda": m.group(1) if m else None, "nvcc": n.group(1) if n else None}


def snapshot(tessera_bin=None, python=None):
    snap = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "git": git(), "cpu": cpu(), "kernel": platform.release(), "load": load(),
            "openblas": openblas(tessera_bin), "gpu": gpu()}
    if python:
        snap["torch"] = torch_info(python)
    return snap


def _load_txt(l):
    return f"{l['load1']:.2f} / {l['load5']:.2f} / {l['load15']:.2f}" + (
        f" ({l['running']} runnable/total)" if "running" in l else "")


def markdown_of(work):
    """The environment section from WORK/env-before.json and env-after.json
    (what `harness env` wrote), after a blank line; [] when the before
    snapshot is missing or unreadable."""
    from harness import load_json_or_empty  # harness imports this module only in its main

    before = load_json_or_empty(os.path.join(work, "env-before.json"))
    after = load_json_or_empty(os.path.join(work, "env-after.json"))
    return [""] + markdown(before, after or None) if before else []


def markdown(before, after=None):
    """The environment section: a list of lines."""
    c, b, g = before["cpu"], before["openblas"], before.get("gpu")
    dirty = " (uncommitted changes in the work tree)" if before["git"].get("dirty") else ""
    lines = [
        "## Environment", "",
        f"- tessera commit: {before['git']['commit']}{dirty}; date {before['date']}",
        f"- CPU: {c.get('model', '?')} (family {c.get('family', '?')} model {c.get('model_id', '?')} "
        f"stepping {c.get('stepping', '?')}; {c.get('isa', '')}){'; a VM' if c.get('hypervisor') else ''}; "
        f"{c.get('cores_online')} cores online, {c.get('cores_allowed')} allowed; "
        f"{c.get('memory_gib', '?')} GiB; Linux {before.get('kernel', '?')}",
        f"- load average (1 / 5 / 15 min) before: {_load_txt(before['load'])}" +
        (f"; after: {_load_txt(after['load'])}" if after else ""),
        f"- tessera's BLAS: {b.get('library')}; kernel (openblas_get_corename): "
        f"{b.get('coretype', 'not found')}; {b.get('config', '')}",
        "- BLAS variables: " + (", ".join(f"{k}={v}" for k, v in b.get("env", {}).items())
                                or "none set (OPENBLAS_CORETYPE, OPENBLAS_L2_SIZE unset)"),
    ]
    t = before.get("torch")
    if t:
        if "error" in t and "version" not in t:
            lines.append(f"- torch ({t.get('python')}): not importable ({t['error']})")
        else:
            lines.append(
                f"- torch {t.get('version')} ({t.get('python')}): BLAS {t.get('blas')}"
                + (f" (MKL {t['mkl']})" if t.get("mkl") else "")
                + f", CPU kernels {t.get('cpu_capability')}, oneDNN {t.get('mkldnn')}, "
                f"CUDA {t.get('cuda')}" + (f"; MKL code path: {t['mkl_code_path']}"
                                            if t.get("mkl_code_path") else ""))
            lines.append(f"- DeepSpeed: {t.get('deepspeed', 'not installed')}")
    if g:
        lines.append(f"- GPU: {'; '.join(g['gpus'])}; driver's CUDA {g.get('driver_cuda')}, "
                     f"nvcc {g.get('nvcc') or 'not found'}")
    else:
        lines.append("- GPU: none visible (nvidia-smi not found or failed)")
    return lines
