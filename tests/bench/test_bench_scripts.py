"""Every script under bench/: its `bash -n`, its `--help`, and where it
writes (read from its text: the scratch, bench/results/ or the caller's OUT,
nothing else in the checkout, no .venv, no fixed /tmp path); and
bench/gpt2_gpu/kernel_families.py on made-up kernel traces. No torch, no
GPU, no tessera binary."""
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def bench_scripts():
    """Every script under bench/ (results aside): a file that is executable
    or starts with a shebang, and bench/lib's sourced shell files."""
    out = []
    for dirpath, dirs, files in os.walk(os.path.join(ROOT, "bench")):
        dirs[:] = sorted(d for d in dirs if d not in ("results", "__pycache__"))
        for name in sorted(files):
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                head = f.read(2)
            if head == b"#!" or os.access(path, os.X_OK) or name.endswith(".sh"):
                out.append(path)
    return out


def is_bash(path):
    with open(path) as f:
        first = f.readline()
    return path.endswith(".sh") or (first.startswith("#!") and "sh" in first.split("/")[-1])


def _skip_subst(text, i):
    """text[i:] starts with $( or ${ (or $((): the index past its matching
    close, quotes and nested substitutions inside taken into account."""
    open_c = text[i + 1]
    close_c = ")" if open_c == "(" else "}"
    depth, j, q = 0, i + 1, None
    while j < len(text):
        c = text[j]
        if q == "'":
            if c == "'":
                q = None
        elif c == "\\":
            j += 1
        elif c == "$" and j + 1 < len(text) and text[j + 1] in "({":
            j = _skip_subst(text, j)
            continue
        elif q == '"':
            if c == '"':
                q = None
        elif c in "'\"":
            q = c
        elif c == open_c and (c == "(" or j == i + 1):  # a bare { inside ${...} does not nest
            depth += 1
        elif c == close_c:
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    return j


def shell_commands(text):
    """The simple commands of a bash script, heredoc bodies, comments and
    quotes aside: a list of (words, redirect targets), each word with its
    quote characters removed and its $(...) and ${...} kept as written;
    the commands inside a $(...) come as commands of their own."""
    cmds, words, targets, word = [], [], [], None
    heredocs, redirect, i, n = [], False, 0, len(text)

    def end_word():
        nonlocal word, redirect
        if word is None:
            return
        w = "".join(word)
        word = None
        if redirect:
            targets.append(w)
            redirect = False
        else:
            words.append(w)

    def end_cmd():
        nonlocal words, targets
        end_word()
        if words or targets:
            cmds.append((words, targets))
        words, targets = [], []

    while i < n:
        c = text[i]
        if c == "\\":
            if i + 1 < n and text[i + 1] != "\n":
                word = (word or []) + [text[i + 1]]
            i += 2
            continue
        if c in "'\"":
            j = i + 1
            word = word or []
            while j < n and text[j] != c:
                if c == '"' and text[j] == "\\":
                    word.append(text[j + 1])
                    j += 2
                    continue
                if c == '"' and text[j] == "$" and j + 1 < n and text[j + 1] in "({":
                    k = _skip_subst(text, j)
                    if text[j + 1] == "(" and text[j + 2] != "(":
                        cmds.extend(shell_commands(text[j + 2:k - 1]))
                    word.append(text[j:k])
                    j = k
                    continue
                word.append(text[j])
                j += 1
            i = j + 1
            continue
        if c == "$" and i + 1 < n and text[i + 1] in "({":
            k = _skip_subst(text, i)
            if text[i + 1] == "(" and text[i + 2] != "(":
                cmds.extend(shell_commands(text[i + 2:k - 1]))
            word = (word or []) + [text[i:k]]
            i = k
            continue
        if c == "#" and word is None:
            while i < n and text[i] != "\n":
                i += 1
            continue
        if c == "\n":
            end_cmd()
            i += 1
            for delim in heredocs:  # their bodies, skipped
                while i < n:
                    line_end = text.find("\n", i)
                    line_end = n if line_end < 0 else line_end
                    line = text[i:line_end]
                    i = line_end + 1
                    if line.strip() == delim:
                        break
            heredocs = []
            continue
        if c in " \t":
            end_word()
            i += 1
            continue
        if c == "<":
            end_word()
            if text.startswith("<<<", i):
                i += 3
            elif text.startswith("<<", i):
                i += 2 + (text[i + 2] == "-")
                while text[i] in " \t":
                    i += 1
                j = i
                while j < n and text[j] not in " \t\n;|&<>)":
                    j += 1
                heredocs.append(text[i:j].strip("'\""))
                i = j
                continue
            else:
                i += 1
            # the word read is not written: let it pass as a plain word
            continue
        if c == ">" or (c == "&" and text.startswith("&>", i)):
            if word is not None and "".join(word).isdigit():
                word = None  # a file descriptor: 2>
            end_word()
            i += 1 if c == ">" else 2
            if i < n and text[i] in ">|":
                i += 1
            if i < n and text[i] == "&":  # >&2, 2>&1: a descriptor, not a file
                i += 1
                continue
            if i < n and text[i] == "(":  # >(...): a process substitution
                continue
            redirect = True
            continue
        if c in ";|&()\n":
            end_cmd()
            i += 1
            continue
        word = (word or []) + [c]
        i += 1
    end_cmd()
    return cmds


ASSIGN = re.compile(r"^([A-Za-z_]\w*)(?:\[[^]]*\])?=(.*)$", re.S)
KEYWORDS = {"if", "then", "else", "elif", "fi", "do", "done", "while", "until", "{", "}", "!",
            "time", "exec", "command", "nice", "env", "local", "export", "declare", "readonly"}
WRITE_ALL = {"tee", "mkdir", "touch"}  # every argument that is no option is written
WRITE_LAST = {"cp", "mv", "ln", "install", "rsync"}
WRITE_OPTS = {"--metrics", "--json", "--out", "--output"}  # the next word is written
NOT_OUTPUT_O = {"grep", "egrep", "fgrep", "set", "shopt", "find", "test", "[", "[["}  # else -o's
WRITE_VALUES = re.compile(r"^(?:run\.dir|checkpoint\.dir|offload\.path|of)=(.*)$", re.S)
WRITE_ENV = {"TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TSR_KERNEL_TRACE", "TMPDIR",
             "TESSERA_BENCH_SCRATCH", "XDG_CACHE_HOME", "HOME", "PYTHONPYCACHEPREFIX"}
SCRATCH = ("$(bench_scratch ", "${TESSERA_BENCH_SCRATCH:-${TMPDIR:-/tmp}/tessera-bench}",
           "${TMPDIR:-/tmp}/tessera-bench")
# tools/gpu-build unpacks its packages there: benches read headers from it.
TMP_READ = ("/tmp/deps/",)


def script_writes(text):
    """(assignments {name: [values]}, written paths) of a bash script."""
    assigns, written = {}, []
    for words, targets in shell_commands(text):
        written += targets
        k = 0
        while k < len(words) and (words[k] in KEYWORDS or ASSIGN.match(words[k])):
            m = ASSIGN.match(words[k])
            if m:
                assigns.setdefault(m.group(1), []).append(m.group(2))
                if m.group(1) in WRITE_ENV:
                    written.append(m.group(2))
            k += 1
        if k < len(words) - 1 and words[k] == "for" and words[k + 2:k + 3] == ["in"]:
            assigns.setdefault(words[k + 1], []).extend(words[k + 3:])
            continue
        if k < len(words) and words[k] == "timeout":  # timeout [OPTIONS] DURATION CMD
            k += 1
            while k < len(words) and (words[k].startswith("-") or words[k][:1].isdigit()
                                      or words[k].startswith("$")):
                k += 1
        name, args = (words[k], words[k + 1:]) if k < len(words) else ("", [])
        plain = [a for a in args if not a.startswith("-")]
        if name in WRITE_ALL:
            written += plain
        elif name in WRITE_LAST and plain:
            written.append(plain[-1])
        if name and "python" in name and args[:2] == ["-m", "venv"]:
            written += args[2:3]
        for a, b in zip(words, words[1:] + [""]):
            if (a in WRITE_OPTS or (a == "-o" and name not in NOT_OUTPUT_O)) and b:
                written.append(b)
            m = WRITE_VALUES.match(a)
            if m:
                written.append(m.group(1))
    return assigns, written


def write_problem(path, assigns, seen=()):
    """None when `path` (as a script writes it) is in the scratch, under
    bench/results/, the caller's (an argument, a variable of the
    environment) or a device; else what is wrong with it."""
    p = path.strip().strip("\"'")
    if not p or p.startswith("/dev/") or p.startswith(SCRATCH):
        return None
    m = re.match(r"^\$\((?:cd|dirname) \"?([^\"]*?)\"?(?: && pwd)?\)", p)
    if m:  # $(cd "X" && pwd), $(dirname "X"): where X is
        return write_problem(m.group(1), assigns, seen)
    m = re.match(r"^\$\{([A-Za-z_]\w*|[0-9@*])(:?[-=?+])(.*?)\}(.*)$", p, re.S)
    if m:  # ${NAME:-DEFAULT}: the variable's values, and the default's
        name, op, word, rest = m.groups()
        checks = [f"${name}{rest}"] if "+" not in op else []
        if "?" not in op and word:
            checks.append(word + rest)
        for c in checks:
            problem = write_problem(c, assigns, seen)
            if problem:
                return problem
        return None
    m = re.match(r"^\$(?:\{([A-Za-z_]\w*|[0-9@*])\}|([A-Za-z_]\w*|[0-9@*]))(.*)$", p, re.S)
    if m:
        name, rest = m.group(1) or m.group(2), m.group(3)
        if name == "root":
            return None if rest.startswith("/bench/results/") else f"{p}: in the checkout"
        if name in ("here", "bench_lib"):
            return f"{p}: beside the bench's sources"
        if name[0].isdigit() or name in "@*" or name not in assigns or name in seen:
            return None  # the caller's (an argument, the environment), or itself
        for v in assigns[name]:
            problem = write_problem(v + rest, assigns, seen + (name,))
            if problem:
                return f"{p} ({name}={v}): {problem}"
        return None
    if p.startswith("/"):
        return f"{p}: a fixed path outside the scratch"
    return f"{p}: relative to the working directory (the checkout)"


def literal_problems(text):
    """A .venv, or a fixed /tmp path, in a script's code (comments aside)."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        code = line.split("#", 1)[0] if not line.lstrip().startswith("#!") else ""
        if ".venv" in code:
            out.append(f"line {n}: a .venv: {line.strip()}")
        rest = code.replace("${TMPDIR:-/tmp}", "").replace('"TMPDIR", "/tmp"', "")
        for m in re.finditer(r"/tmp\b", rest):
            if not rest.startswith(TMP_READ, m.start()):
                out.append(f"line {n}: a fixed /tmp path: {line.strip()}")
                break
    return out


def bash_problems(text):
    assigns, written = script_writes(text)
    out = [problem for problem in (write_problem(w, assigns) for w in written) if problem]
    return out + literal_problems(text)


class Scripts(unittest.TestCase):
    def test_every_bench_script_parses_and_has_help(self):
        scripts = bench_scripts()
        self.assertGreaterEqual(len([s for s in scripts if s.endswith("/run")]), 8)
        self.assertIn(os.path.join(ROOT, "bench", "gpt2_gpu", "kernel_table"), scripts)
        for s in scripts:
            self.assertTrue(is_bash(s), f"{s}: a script under bench/ that is not bash")
            r = subprocess.run(["bash", "-n", s], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, f"bash -n {s}: {r.stderr}")
        for s in scripts:
            if s.endswith(".sh"):
                continue  # sourced, not run
            # A script that does not handle --help would run the bench: not here.
            with open(s) as f:
                self.assertIn("--help", f.read(), f"{s} has no --help")
            r = subprocess.run([s, "--help"], capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 0, f"{s} --help: {r.stderr}")
            self.assertIn("bench/", r.stdout, s)
            self.assertGreater(len(r.stdout.splitlines()), 3, s)

    def test_benches_write_only_to_the_scratch_results_or_the_callers_out(self):
        scripts = bench_scripts()
        for s in scripts:
            with open(s) as f:
                text = f.read()
            self.assertEqual(bash_problems(text), [], s)
            # Python run from it writes no bytecode beside the sources.
            if re.search(r"python3|\$py\b|\$\{py\}", text) and not s.endswith("common.sh"):
                self.assertTrue(re.search(r'^\. "\$root/bench/lib/common\.sh"', text, re.M) or
                                "export PYTHONDONTWRITEBYTECODE=1" in text,
                                f"{s}: runs Python without bench/lib/common.sh "
                                "(PYTHONDONTWRITEBYTECODE)")
        for s in glob.glob(os.path.join(ROOT, "bench", "*", "*.py")):
            with open(s) as f:
                text = f.read()
            self.assertEqual(literal_problems(text), [], s)
            self.assertNotIn("$root/data/", text, s)
            # Paths built from the checkout are read, or under bench/results.
            for m in re.finditer(r"(open|makedirs)\(\s*os\.path\.join\(\s*(ROOT|HERE)", text):
                self.fail(f"{s}: writes under the checkout: {m.group(0)}")
            for m in re.finditer(r"os\.path\.join\(\s*ROOT,([^)]*)\)", text):
                if "results" in m.group(1):
                    self.assertRegex(m.group(1), r'^\s*"bench",\s*"results"', s)

    def test_the_write_check_catches_what_it_should(self):
        bad = {
            "mkdir -p .venv\n": "relative",
            'python3 -m venv "$here/.venv"\n': "beside",
            'logs=/tmp/gpt2-fused\nmkdir -p "$logs"\n': "fixed path",
            'build=${BUILD:-/tmp/bg}\ntools/gpu-build "$build"\n': "fixed /tmp",
            '"$bin" run c.toml --set run.dir="\\"$root/runs/a\\""\n': "in the checkout",
            'echo hi > notes.txt\n': "relative",
            'x=1; cd "$root" && "$py" t.py --metrics runs/m.jsonl\n': "relative",
            'g++ -O2 a.cpp -o "$here/a.out"\n': "beside",
            'TORCHINDUCTOR_CACHE_DIR="$root/.cache" "$py" t.py\n': "in the checkout",
            'f() { echo x >"$d/y"; }\nd="$root/data"\n': "in the checkout",
            'out=${2:-$root/out.md}\necho >"$out"\n': "in the checkout",
            '{ echo; } | tee "$here/r.md"\n': "beside",
            'echo "${x:-{\\}}" >"$work/a"; echo >"$here/b"\n': "beside",
        }
        for text, why in bad.items():
            problems = bash_problems(text)
            self.assertTrue(problems, text)
            self.assertIn(why, " ".join(problems), text)
        good = ('work=$(bench_scratch x)\nout=${2:-/dev/stdout}\necho "a > b" >"$work/a" 2>&1\n'
                'cat <<EOF >"$work/b"\nx > y\nEOF\n'
                'python3 - "$work" <<\'PY\' | tee "$out"\nopen("z", "w") if 2 > 1 else 0\nPY\n'
                'n=$((a > b ? a : b)) ; echo "$(cd "$work" && pwd)" >>"$root/bench/results/r.md"\n'
                'dd if=/dev/zero of="$work/dd.bin" bs=1M count=1 >&2\n'
                'set -euo pipefail; x=$(grep -o "a b" "$work/l" | head -1)\n'
                '"$bin" ckpt export "$ckpt" -o "$work/hf"\n'
                'echo "${alone:-{\\}}" >"$work/alone.json"\n'
                'd="${TESSERA_BENCH_SCRATCH:-${TMPDIR:-/tmp}/tessera-bench}/$1"; mkdir -p "$d"\n'
                '"$bin" run c.toml --set run.dir="\\"$work/r\\"" >"$1.log"\n')
        self.assertEqual(bash_problems(good), [])



    def test_every_bench_with_reps_refuses_too_few_before_running(self):
        """REPS=2 (a figure needs 3) stops a bench at once, naming REPS, not
        after minutes of runs (here no bench has a build, so one that got
        past the check would fail on that instead)."""
        seen = 0
        for path in glob.glob(os.path.join(ROOT, "bench", "*", "run")):
            with open(path) as f:
                if "${REPS:-" not in f.read():
                    continue
            seen += 1
            env = dict(os.environ, REPS="2", TESSERA_BENCH_SCRATCH=tempfile.mkdtemp())
            r = subprocess.run([path], env=env, cwd=ROOT,
                               capture_output=True, text=True, timeout=60)
            self.assertNotEqual(r.returncode, 0, path)
            self.assertIn("REPS=2", r.stderr, f"{path}: {r.stderr[-400:]}")
        self.assertGreaterEqual(seen, 8)


class KernelFamilies(unittest.TestCase):
    """bench/gpt2_gpu/kernel_families.py on a made-up trace whose figures are
    known by construction: per step a 5 ms GEMM, 1 ms attention forward,
    2 ms attention backward, 0.5 ms cross-entropy and two 0.25 ms optimizer
    kernels, each followed by 0.1 ms of idle GPU."""

    def test_per_step_families_busy_share_and_window(self):
        per_step = [("nvjet_sm90_tst_256x128_NNT", 5.0), ("cudnn_sdpa_flash_fprop", 1.0),
                    ("cudnn_sdpa_flash_bprop", 2.0), ("ce_rows<bf16>", 0.5),
                    ("step_kernel<AdamOp>", 0.25), ("step_kernel<AdamOp>", 0.25)]
        lines, t = [], 0
        for _ in range(10):
            for name, ms in per_step:
                lines.append(f"{t}\t{t + int(ms * 1e6)}\t7\t{name}")
                t += int(ms * 1e6) + 100000
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "t.tsv")
            with open(path, "w") as f:
                f.write("\n".join(lines) + "\n")
            out_json = os.path.join(d, "f.json")
            r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "gpt2_gpu", "kernel_families.py"),
                                f"x={path}", "--warmup", "2", "--json", out_json],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(out_json) as f:
                res = json.load(f)["x"]
        self.assertEqual(res["steps"], 7)
        fam = res["families"]
        self.assertAlmostEqual(fam["matmul"], 5.0)
        self.assertAlmostEqual(fam["attention forward"], 1.0)
        self.assertAlmostEqual(fam["attention backward"], 2.0)
        self.assertAlmostEqual(fam["classifier (softmax, cross-entropy)"], 0.5)
        self.assertAlmostEqual(fam["optimizer"], 0.5)
        # The window runs from the end of one optimizer run to the end of a
        # later one: a whole step is 9 ms of kernels and 0.6 ms idle.
        self.assertAlmostEqual(res["step_ms"], 9.6)
        self.assertAlmostEqual(res["busy"], 9.0 / 9.6)
        self.assertAlmostEqual(res["kernels_per_step"], 6)
        self.assertIn("| matmul | 5.000 |", r.stdout)
        # Per kernel: the optimizer's two launches a step are one name.
        opt = [k for k in res["kernels"] if k["family"] == "optimizer"]
        self.assertEqual(len(opt), 1)
        self.assertAlmostEqual(opt[0]["calls_per_step"], 2)
        self.assertAlmostEqual(opt[0]["ms_per_step"], 0.5)

    SCRIPT = os.path.join(ROOT, "bench", "gpt2_gpu", "kernel_families.py")

    @staticmethod
    def steps(per_step, n=6):
        """Trace lines of n steps, each the given (name, ms) kernels back to
        back on stream 7 (a name may carry the grid column after a tab)."""
        lines, t = [], 0
        for _ in range(n):
            for name, ms in per_step:
                lines.append(f"{t}\t{t + int(ms * 1e6)}\t7\t{name}")
                t += int(ms * 1e6)
        return lines

    def top_matmul(self, d, lines):
        """Writes the trace lines into d and runs --top matmul on them:
        (the trace's path, the finished run)."""
        path = os.path.join(d, "t.tsv")
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        r = subprocess.run([sys.executable, self.SCRIPT, f"x={path}", "--warmup", "1", "--top", "matmul"],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        return path, r

    def test_top_lists_a_familys_kernels_and_refuses_an_unknown_family(self):
        lines = self.steps([("nvjet_a", 3.0), ("nvjet_b", 1.0), ("nvjet_b", 1.0),
                            ("step_kernel<AdamOp>", 0.5)])
        with tempfile.TemporaryDirectory() as d:
            path, r = self.top_matmul(d, lines)
            self.assertIn("| `nvjet_a` | 1.0 | 3.000 | 3000.0 |", r.stdout)
            self.assertIn("| `nvjet_b` | 2.0 | 2.000 | 1000.0 |", r.stdout)
            bad = subprocess.run([sys.executable, self.SCRIPT, f"x={path}", "--top", "matmuls"],
                                 capture_output=True, text=True)
            self.assertNotEqual(bad.returncode, 0)
            self.assertIn("'matmuls': not a family", bad.stderr)

    def test_top_keeps_one_kernel_on_two_grids_apart(self):
        # Newer traces carry each launch's grid: the same GEMM kernel on two
        # shapes is two rows of --top, each with its own calls and time.
        lines = self.steps([("nvjet_a\t64x16x1", 3.0), ("nvjet_a\t16x4x1", 1.0),
                            ("step_kernel<AdamOp>\t8x1x1", 0.5)])
        with tempfile.TemporaryDirectory() as d:
            _, r = self.top_matmul(d, lines)
            self.assertIn("| `nvjet_a [grid 64x16x1]` | 1.0 | 3.000 | 3000.0 |", r.stdout)
            self.assertIn("| `nvjet_a [grid 16x4x1]` | 1.0 | 1.000 | 1000.0 |", r.stdout)
            self.assertIn("| matmul | 4.000 |", r.stdout)


if __name__ == "__main__":
    unittest.main()
