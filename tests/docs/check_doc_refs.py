#!/usr/bin/env python3
"""Every documentation reference in the repository resolves: each
`docs/NAME.md` named in a tracked file (code, configs, scripts, docs) is a
file, and each relative link of a Markdown file ([text](path) or
[text](path#anchor)) points to a file or folder that exists. A reader sent
to a page that is not there is a defect like any other.

  check_doc_refs.py ROOT      exit 0 when every reference resolves, else 1,
                              listing each broken one as FILE:LINE: REF
"""
import os
import re
import subprocess
import sys

DOC_REF = re.compile(r"\bdocs/[a-z0-9_.-]+\.md\b")  # pages are lower case; NAME is a placeholder
MD_LINK = re.compile(r"\]\(([^)\s]+)\)")
SKIP_DIRS = {".git", "build", "build-debug", "build-asan", "build-fuzz", "node_modules"}


def tracked_files(root):
    try:
        out = subprocess.run(["git", "-C", root, "ls-files"], capture_output=True, text=True,
                             check=True).stdout.split("\n")
        return [f for f in out if f]
    except (OSError, subprocess.CalledProcessError):  # not a checkout: every file
        files = []
        for d, dirs, names in os.walk(root):
            dirs[:] = [x for x in dirs if x not in SKIP_DIRS and not x.startswith(".")]
            files += [os.path.relpath(os.path.join(d, n), root) for n in names]
        return files


def broken_refs(root):
    bad = []
    for rel in tracked_files(root):
        path = os.path.join(root, rel)
        if rel.startswith("tests/data/") or not os.path.isfile(path):
            continue
        try:
            text = open(path, encoding="utf-8").read()
        except (UnicodeDecodeError, OSError):
            continue  # binary data
        for n, line in enumerate(text.split("\n"), 1):
            for m in DOC_REF.finditer(line):
                if not os.path.isfile(os.path.join(root, m.group(0))):
                    bad.append(f"{rel}:{n}: {m.group(0)}")
            if not rel.endswith(".md"):
                continue
            for m in MD_LINK.finditer(line):
                target = m.group(1).split("#")[0]
                if not target or re.match(r"^[a-z]+:", target):  # anchors, URLs, mailto
                    continue
                if not os.path.exists(os.path.join(os.path.dirname(path), target)):
                    bad.append(f"{rel}:{n}: link {m.group(1)}")
    return bad


def main(argv):
    if len(argv) != 2 or argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(argv) == 2 else 2
    bad = broken_refs(argv[1])
    for b in bad:
        print(b)
    if bad:
        print(f"check_doc_refs: {len(bad)} reference(s) to nothing: fix the name or write the page")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
