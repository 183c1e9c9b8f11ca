#!/usr/bin/python3
"""Runs an example (under tools/px-cluster) and checks what it printed (ctest -L examples).

    check_output.py [--expect REGEX]... [--expect-count N REGEX]... [--decreasing REGEX]
                    -- COMMAND [ARGS...]

Passes when COMMAND exits 0 and its output (stdout and stderr together, printed here in
full) has a match of every --expect REGEX, exactly N matches of each --expect-count REGEX,
and, for --decreasing REGEX (one group: a number), at least two matches whose last number
is smaller than the first (a loss that went down). Regexes are Python's, multi-line (^ and
$ match at each line). Python stdlib only.
"""
import argparse
import re
import subprocess
import sys


def main():
    if "--" not in sys.argv:
        sys.exit(__doc__.strip().splitlines()[2].strip())
    split = sys.argv.index("--")
    parser = argparse.ArgumentParser(usage=__doc__.strip().splitlines()[2].strip())
    parser.add_argument("--expect", action="append", default=[], metavar="REGEX")
    parser.add_argument("--expect-count", action="append", nargs=2, default=[],
                        metavar=("N", "REGEX"))
    parser.add_argument("--decreasing", metavar="REGEX")
    args = parser.parse_args(sys.argv[1:split])
    command = sys.argv[split + 1:]
    if not command:
        parser.error("no COMMAND after --")

    run = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = run.stdout
    print(output, end="" if output.endswith("\n") or not output else "\n", flush=True)
    failures = []
    if run.returncode != 0:
        failures.append(f"the command exited with status {run.returncode}")
    for pattern in args.expect:
        if not re.search(pattern, output, re.M):
            failures.append(f"no line matches {pattern!r}")
    for count, pattern in args.expect_count:
        found = len(re.findall(pattern, output, re.M))
        if found != int(count):
            failures.append(f"{found} matches of {pattern!r}, {count} expected")
    if args.decreasing:
        values = [float(m) for m in re.findall(args.decreasing, output, re.M)]
        if len(values) < 2:
            failures.append(f"{len(values)} matches of {args.decreasing!r}, at least 2 expected")
        elif not values[-1] < values[0]:
            failures.append(f"{args.decreasing!r}: the last value {values[-1]} is not below "
                            f"the first {values[0]}")
        else:
            print(f"check_output: {values[0]:g} -> {values[-1]:g}: decreased")
    for message in failures:
        print(f"check_output: FAIL: {message}")
    if failures:
        sys.exit(1)
    print("check_output: ok: exit status 0 and every expected line")


if __name__ == "__main__":
    main()
