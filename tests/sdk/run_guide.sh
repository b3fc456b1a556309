#!/usr/bin/env bash
# run_guide.sh GUIDE.md SOURCE_DIR BUILD_DIR WORK: follows a guide in docs/
# the way a reader would, running every command in it.
#
# Every ```sh block of the guide must be marked, on the line before it, with
#   <!-- test -->                 run by this test
#   <!-- test: skip (REASON) -->  not run (only for what cannot run here, such
#                                 as `git clone` from the network)
# An unmarked ```sh block fails the test, so no command is left unchecked.
# What a page takes as given (README.md: "your" ds.json, a language model
# to sample from) is made by commands in an HTML comment, which the reader
# does not see, run where they stand:
#   <!-- test: setup (WHAT)
#   command...
#   -->
# The marked blocks run in order, as one bash session (set -euo pipefail), so
# `cd` and `export` carry over as in a terminal, with
#  - HOME a fresh WORK/home (where the guides install tessera and create
#    their plugin projects);
#  - the working directory a fresh "clone" where the guides clone to,
#    ~/tessera: links to everything in SOURCE_DIR, and `build` linked to
#    BUILD_DIR (so the guide's tools/build is the incremental build of this
#    tree); not `runs` or `data`, which the guides write (runs, prepared
#    data) and which stay in WORK, out of the source tree.
# The commands and their output go to the test log.
#
# With GUIDE_QUICK_RUN_STEPS=N (docs/quickstart.md, whose runs train for
# minutes), every `tessera run` and `tools/quickstart` line gets
# `--set run.steps=N` appended (before a trailing # comment), and `tessera`
# is build/bin/tessera, as that page says.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/lib.sh"
guide=$1 src=$2 build=$3 work=$4

rm -rf "$work"
clone="$work/home/tessera"
mkdir -p "$clone"
for entry in "$src"/* "$src"/.[!.]*; do
  [ -e "$entry" ] || continue
  name=$(basename "$entry")
  case "$name" in
    .git | build | build-* | runs | data) continue ;;
  esac
  ln -s "$entry" "$clone/$name"
done
ln -s "$build" "$clone/build"

script="$work/guide.sh"
steps="${GUIDE_QUICK_RUN_STEPS:-}"
awk -v guide="$guide" -v steps="$steps" '
  function die(msg) { printf "%s:%d: %s\n", guide, NR, msg > "/dev/stderr"; bad = 1; exit 1 }
  function shorten(line,    at, cmd, comment) {
    if (steps == "") return line
    if (line !~ "(^|[ /])tessera run( |$)" && line !~ "^tools/quickstart( |$)") return line
    at = index(line, " #")
    cmd = at ? substr(line, 1, at - 1) : line
    comment = at ? substr(line, at) : ""
    sub(/[ \t]+$/, "", cmd)
    return cmd " --set run.steps=" steps comment
  }
  BEGIN {
    mark = ""; inblock = 0; insetup = 0; blocks = 0; print "set -euo pipefail"
    if (steps != "") print "export PATH=\"$PWD/build/bin:$PATH\""
  }
  inblock {
    if ($0 ~ /^```[ \t]*$/) { inblock = 0; if (run) print "echo \"+++ end of block " blocks "\""; next }
    if (run) print shorten($0)
    next
  }
  insetup {
    if ($0 ~ /^-->[ \t]*$/) { insetup = 0; print "echo \"+++ end of setup\""; next }
    print
    next
  }
  /^<!-- test: setup/ {
    if (mark != "") die("<!-- test --> must come right before a ```sh block")
    printf "echo \"+++ setup (%s line %d)\"\n", guide, NR
    if ($0 !~ /-->[ \t]*$/) insetup = 1
    next
  }
  /^<!-- test -->[ \t]*$/ { mark = "test"; next }
  /^<!-- test: skip/ { mark = "skip"; next }
  /^```sh[ \t]*$/ {
    if (mark == "") die("a ```sh block without <!-- test --> or <!-- test: skip (why) --> before it")
    inblock = 1; run = mark == "test"; mark = ""
    if (run) { blocks++; printf "echo \"+++ block %d (%s line %d)\"\n", blocks, guide, NR }
    next
  }
  /^```/ { if (mark != "") die("<!-- test --> must come right before a ```sh block"); next }
  /^[ \t]*$/ { next }
  { if (mark != "") die("<!-- test --> must come right before a ```sh block") }
  END {
    if (bad) exit 1
    if (inblock) die("unterminated code block")
    if (insetup) die("unterminated <!-- test: setup")
    if (blocks == 0) die("no <!-- test --> blocks")
    print "echo \"+++ all " blocks " blocks ran\""
  }
' "$guide" >"$script"

echo "running the commands of $guide in $clone (HOME=$work/home)"
cd "$clone"
HOME="$work/home" bash -x "$script" 2>&1
