#!/usr/bin/python3
"""Checks that every C, C++ and CUDA source of the project is formatted as the repository's
.clang-format says (clang-format --dry-run --Werror).

    check_format.py [--root DIR] [--clang-format PROGRAM]
    check_format.py --self-test          first prove that a misformatted file is caught

The sources are those tools/check_layers.py checks: git's tracked and untracked (not
ignored) files, else a walk that skips build trees; nothing generated or third-party lives
among them. clang-format is Debian 12's clang-format 14 (`clang-format-14`, else
`clang-format`); another version may format differently, and says so. To fix what it
reports: `clang-format-14 -i FILE`. Python stdlib only.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_layers import project_sources  # noqa: E402

WANTED_MAJOR = 14
BATCH = 100


def find_clang_format(given):
    for name in ([given] if given else ["clang-format-14", "clang-format"]):
        path = shutil.which(name)
        if path:
            return path
    return None


def misformatted(clang_format, root, files):
    """The files clang-format would change, with its first complaint about each."""
    bad = {}
    for i in range(0, len(files), BATCH):
        batch = files[i:i + BATCH]
        r = subprocess.run([clang_format, "--dry-run", "--Werror", "--style=file"] + batch,
                           cwd=root, capture_output=True, text=True)
        for line in r.stderr.splitlines():
            m = re.match(r"^(.+?):(\d+):\d+: (?:error|warning)", line)
            if m:
                bad.setdefault(m.group(1), "line %s" % m.group(2))
        if r.returncode != 0 and not bad:
            sys.exit("check_format: %s failed: %s" % (clang_format, r.stderr.strip()))
    return bad


def self_test(clang_format, root):
    """A misformatted file beside a copy of .clang-format is caught; a formatted one is not."""
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(os.path.join(root, ".clang-format"), tmp)
        with open(os.path.join(tmp, "good.cc"), "w") as fh:
            fh.write("int f(int x) {\n  return x + 1;\n}\n")
        with open(os.path.join(tmp, "bad.cc"), "w") as fh:
            fh.write("int  f(int x){return x+1;}\n")
        bad = misformatted(clang_format, tmp, ["good.cc", "bad.cc"])
        if "bad.cc" not in bad:
            failures.append("self-test: a misformatted file is not caught")
        if "good.cc" in bad:
            failures.append("self-test: a formatted file is reported")
    return failures


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(
        __file__))), help="the repository (default: this script's)")
    ap.add_argument("--clang-format", help="the program (default: clang-format-14, "
                    "else clang-format)")
    ap.add_argument("--self-test", action="store_true")
    args = ap.parse_args()
    clang_format = find_clang_format(args.clang_format)
    if not clang_format:
        sys.exit("check_format: no clang-format on PATH (Debian: apt-get install clang-format; "
                 "tools/quickstart installs it)")
    version = subprocess.run([clang_format, "--version"], capture_output=True,
                             text=True).stdout.strip()
    m = re.search(r"version (\d+)", version)
    if not m or int(m.group(1)) != WANTED_MAJOR:
        print("check_format: warning: %s is not clang-format %d, which the tree is formatted "
              "with; its differences may be its own" % (version, WANTED_MAJOR))
    failures = self_test(clang_format, args.root) if args.self_test else []
    files = project_sources(args.root)
    if not files:
        failures.append("no C, C++ or CUDA sources found under %s" % args.root)
    bad = misformatted(clang_format, args.root, files)
    for f in sorted(bad):
        failures.append("%s: not formatted (first at %s): %s -i %s"
                        % (f, bad[f], os.path.basename(clang_format), f))
    for f in failures:
        print("check_format: " + f, file=sys.stderr)
    print("check_format: %d sources, %d not formatted (%s)" % (len(files), len(bad), version))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
