#!/usr/bin/python3
"""px-bench soak: the demo's language model for many steps; do the daemons hold steady?

    soak.py [--steps 10000] [--sample-at 1000] [--every 250] [--tolerance 0.02] [--json]
            [--nodes 2] [--workers-per-node 2] [--daemon PATH] [--lib PATH] ...

Trains tools/lm/train.py (the demo's model, on the KJV Bible) through tools/px-cluster
(loopback, --nodes x --workers-per-node, 2 x 2 as the demo) for --steps steps and samples,
for every parallaxd (and, as extra information, every worker), VmRSS (with its anonymous,
file and shared-memory parts) from /proc/PID/status and the number of /proc/PID/fd
entries: when rank 0 reports step --sample-at, every --every steps (the curve), and at the
end, in the window train.py's --pause-after-train leaves between the last step and the
evaluation (every worker has finished training; no daemon has seen a worker leave). Steps
are train.py's, 0-based: "step 1000" is sampled when rank 0 prints step 1000, after 1,001
steps. The target: every daemon's RSS and open fds at the end within --tolerance of their
values at --sample-at. Prints one JSON object (--json) or a table; exits 1 if the run
fails, 0 when it completes whether or not the target is met (--check: 3 if it is missed).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
STATUS_FIELDS = {"VmRSS": "rss_kib", "VmHWM": "hwm_kib", "RssAnon": "rss_anon_kib",
                 "RssFile": "rss_file_kib", "RssShmem": "rss_shmem_kib", "Threads": "threads"}
STEP_LINE = re.compile(r"^step\s+(\d+)\s+loss\s+(\S+)")
TRAINED_LINE = re.compile(r"^trained (\d+) steps in ([\d.]+) s: (\d+) words/s")
PAUSE_LINE = "paused after training"


def args_of(argv):
    p = argparse.ArgumentParser(description="px-bench soak: daemon RSS and fds over a long run")
    p.add_argument("--steps", type=int, default=10_000)
    p.add_argument("--sample-at", type=int, default=1000, help="the reference step")
    p.add_argument("--every", type=int, default=250, help="sample every N steps (the curve)")
    p.add_argument("--tolerance", type=float, default=0.02, help="end vs reference, relative")
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--workers-per-node", type=int, default=2)
    p.add_argument("--daemon", default=os.path.join(ROOT, "build", "daemon", "parallaxd"))
    p.add_argument("--lib", default=os.environ.get("PARALLAX_LIB") or
                   os.path.join(ROOT, "build", "clients", "c", "libparallax.so.1"),
                   help="libparallax.so.1 for the workers (PARALLAX_LIB)")
    p.add_argument("--pause", type=float, default=5.0,
                   help="train.py --pause-after-train: the end sample's window, seconds")
    p.add_argument("--train-arg", action="append", default=[],
                   help="one more argument for train.py (repeatable)")
    p.add_argument("--timeout", type=int, default=0,
                   help="px-cluster --timeout (default: 2 s a step + 600 s)")
    p.add_argument("--logs", default="", help="keep the daemons' logs here")
    p.add_argument("--check", action="store_true", help="exit 3 if the target is missed")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    if not 0 <= a.sample_at < a.steps - 1:
        p.error("--sample-at must be a step before the last (0-based)")
    if a.every <= 0:
        p.error("--every must be positive")
    return a


# --- /proc ----------------------------------------------------------------------------
def children_of(root: int) -> list[int]:
    """Every live descendant of root."""
    parent = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
            parent[int(d)] = int(stat[stat.rindex(")") + 2:].split()[1])
        except (OSError, ValueError):
            continue
    out, frontier = [], [root]
    while frontier:
        nxt = [pid for pid, pp in parent.items() if pp in frontier]
        out += nxt
        frontier = nxt
    return out


def cmdline(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return [x.decode(errors="replace") for x in f.read().split(b"\0") if x]


def environ(pid: int) -> dict:
    with open(f"/proc/{pid}/environ", "rb") as f:
        pairs = [x.decode(errors="replace").split("=", 1) for x in f.read().split(b"\0") if x]
    return {k: v for k, v in (p for p in pairs if len(p) == 2)}


def fd_kind(target: str) -> str:
    if target.startswith(("socket:", "pipe:")):
        return target.split(":", 1)[0]
    if target.startswith("anon_inode:"):
        return target.replace("[", "").replace("]", "")
    if target.startswith("/dev/shm/") or target.startswith("/memfd:"):
        return "shm"
    return "file"


def measure(pid: int, kinds: bool) -> dict:
    m = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in STATUS_FIELDS:
                m[STATUS_FIELDS[key]] = int(value.split()[0])
    fds = os.listdir(f"/proc/{pid}/fd")
    m["fds"] = len(fds)
    if kinds:
        count = {}
        for fd in fds:
            try:
                k = fd_kind(os.readlink(f"/proc/{pid}/fd/{fd}"))
            except OSError:
                continue
            count[k] = count.get(k, 0) + 1
        m["fd_kinds"] = dict(sorted(count.items()))
    return m


def find_processes(cluster_pid: int, daemon: str) -> tuple[dict, dict]:
    """{node: pid} of the daemons and {(node, local_rank): pid} of the workers."""
    daemons, workers = {}, {}
    for pid in children_of(cluster_pid):
        try:
            exe = os.path.realpath(f"/proc/{pid}/exe")
            argv = cmdline(pid)
            if exe == daemon:
                node = int(argv[argv.index("--node-index") + 1]) if "--node-index" in argv else 0
                daemons[node] = pid
            elif any(x.endswith("train.py") for x in argv) and "python" in os.path.basename(exe):
                env = environ(pid)
                workers[(int(env["PX_CLUSTER_NODE"]), int(env["PARALLAX_LOCAL_RANK"]))] = pid
        except (OSError, ValueError, KeyError):
            continue  # gone, or not ours
    return daemons, workers


# --- driver ---------------------------------------------------------------------------
def main(a) -> int:
    daemon = os.path.realpath(a.daemon)
    lib = os.path.realpath(a.lib)
    for what, path in (("--daemon", daemon), ("--lib", lib)):
        if not os.path.isfile(path):
            sys.stderr.write(f"px-bench soak: {what} {path}: no such file\n")
            return 1
    log_every = math.gcd(a.every, a.sample_at) or a.every
    timeout = a.timeout or 2 * a.steps + 600
    cmd = [os.path.join(ROOT, "tools", "px-cluster"), "--nodes", str(a.nodes),
           "--workers-per-node", str(a.workers_per_node), "--daemon", daemon,
           "--timeout", str(timeout)]
    if a.logs:
        cmd += ["--logs", a.logs]
    cmd += ["--", "/usr/bin/python3", os.path.join(ROOT, "tools", "lm", "train.py"),
            "--steps", str(a.steps), "--log-every", str(log_every),
            "--pause-after-train", str(a.pause), *a.train_arg]
    env = dict(os.environ, PARALLAX_LIB=lib,
               PYTHONPATH=os.pathsep.join(
                   [os.path.join(ROOT, "clients", "python")] +
                   ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])))
    shown = (f"PYTHONPATH={shlex.quote(os.path.join(ROOT, 'clients', 'python'))} "
             f"PARALLAX_LIB={shlex.quote(lib)} " + shlex.join(cmd))

    err = tempfile.TemporaryFile(mode="w+")
    t_start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env,
                            cwd=ROOT)
    samples, tail, trained, last_loss = [], [], None, None
    reference = end = None
    daemon_pids = {}
    problems = []

    def take(step, label):
        daemons, workers = find_processes(proc.pid, daemon)
        if len(daemons) != a.nodes:
            problems.append(f"{label}: found {len(daemons)} parallaxd, expected {a.nodes}")
        for node, pid in daemons.items():
            if daemon_pids.setdefault(node, pid) != pid:
                problems.append(f"{label}: node {node}'s parallaxd is a new process {pid}")
        s = {"step": step, "label": label, "t_s": round(time.monotonic() - t_start, 2),
             "daemons": [], "workers": []}
        for node, pid in sorted(daemons.items()):
            try:
                s["daemons"].append({"node": node, "pid": pid, **measure(pid, True)})
            except OSError as e:
                problems.append(f"{label}: node {node}'s parallaxd: {e}")
        for (node, rank), pid in sorted(workers.items()):
            try:
                s["workers"].append({"node": node, "local_rank": rank, "pid": pid,
                                     **measure(pid, False)})
            except OSError:
                pass
        samples.append(s)
        d = "  ".join(f"node {x['node']}: {x['rss_kib'] / 1024:.1f} MiB {x['fds']} fds"
                      for x in s["daemons"])
        sys.stderr.write(f"px-bench soak: {label:>9} step {step:>6}  {d}\n")  # progress
        return s

    def stop(signum, _frame):
        proc.send_signal(signal.SIGTERM)  # px-cluster tears its cluster down
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        for line in proc.stdout:
            line = line.rstrip("\n")
            tail = (tail + [line])[-40:]
            m = STEP_LINE.match(line)
            if m:
                step, last_loss = int(m.group(1)), float(m.group(2))
                if step == a.sample_at:
                    reference = take(step, "reference")
                elif step % a.every == 0:
                    take(step, "curve")
            elif line.startswith(PAUSE_LINE):
                end = take(a.steps - 1, "end")
            elif TRAINED_LINE.match(line):
                trained = TRAINED_LINE.match(line)
        rc = proc.wait()
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait()
    wall_s = time.monotonic() - t_start

    result = {"scenario": "soak", "date": datetime.date.today().isoformat(),
              "cores": os.cpu_count(), "nodes": a.nodes, "workers_per_node": a.workers_per_node,
              "steps": a.steps, "sample_at": a.sample_at, "every": a.every,
              "tolerance": a.tolerance, "command": shown,
              "driver": shlex.join([sys.executable, os.path.abspath(__file__), *sys.argv[1:]]),
              "exit_status": rc, "wall_s": round(wall_s, 1)}
    if trained:
        result.update(train_s=float(trained.group(2)),
                      steps_per_s=round(int(trained.group(1)) / float(trained.group(2)), 3),
                      words_per_s=int(trained.group(3)))
    result["final_loss"] = last_loss

    if reference is None or end is None:
        problems.append("no sample at " + ("the reference step" if reference is None else
                                           "the end (no 'paused after training' line)"))
    if reference is not None and end is not None:
        def compare(group, key):
            rows = []
            before = {tuple(x.get(k) for k in key): x for x in reference[group]}
            for x in end[group]:
                r = before.get(tuple(x.get(k) for k in key))
                if r is None:
                    continue
                row = {k: x[k] for k in key}
                for q in ("rss_kib", "fds"):
                    row[q] = {"at_sample": r[q], "at_end": x[q],
                              "ratio": round(x[q] / r[q], 4) if r[q] else None}
                row["rss_parts_kib"] = {
                    p: {"at_sample": r.get(p + "_kib"), "at_end": x.get(p + "_kib")}
                    for p in ("rss_anon", "rss_file", "rss_shmem")}
                if group == "daemons":
                    row["fd_kinds"] = {"at_sample": r["fd_kinds"], "at_end": x["fd_kinds"]}
                    row["within_tolerance"] = all(
                        row[q]["ratio"] is not None and
                        abs(row[q]["ratio"] - 1) <= a.tolerance + 1e-12 for q in ("rss_kib", "fds"))
                rows.append(row)
            return rows

        result["daemons"] = compare("daemons", ("node", "pid"))
        result["workers"] = compare("workers", ("node", "local_rank", "pid"))
        if len(result["daemons"]) != a.nodes:
            problems.append("a daemon is missing from the reference or the end sample")
        result["target_met"] = (len(result["daemons"]) == a.nodes and
                                all(d["within_tolerance"] for d in result["daemons"]))
    result["curve"] = [{"step": s["step"], "label": s["label"], "t_s": s["t_s"],
                        "daemons": [{k: d[k] for k in ("node", "rss_kib", "rss_anon_kib",
                                                       "rss_shmem_kib", "fds", "threads")}
                                    for d in s["daemons"]],
                        "workers": [{k: w[k] for k in ("node", "local_rank", "rss_kib", "fds")}
                                    for w in s["workers"]]} for s in samples]
    failed = rc != 0 or bool(problems)
    if problems:
        result["problems"] = problems
    if failed:
        err.seek(0)
        result["stdout_tail"] = tail[-20:]
        result["stderr_tail"] = err.read()[-3000:].splitlines()

    if a.json:
        print(json.dumps(result))
    else:
        print(f"soak: {a.steps} steps on {a.nodes} nodes x {a.workers_per_node} workers, "
              f"{result.get('steps_per_s', 0):.2f} steps/s; exit {rc}")
        for d in result.get("daemons", []):
            print(f"  parallaxd node {d['node']}: RSS {d['rss_kib']['at_sample']} -> "
                  f"{d['rss_kib']['at_end']} KiB (x{d['rss_kib']['ratio']}), fds "
                  f"{d['fds']['at_sample']} -> {d['fds']['at_end']} "
                  f"(x{d['fds']['ratio']}): {'within' if d['within_tolerance'] else 'BEYOND'} "
                  f"{a.tolerance:.0%}")
        for p in problems:
            print(f"  problem: {p}")
        if failed:
            print("\n".join(result["stdout_tail"] + result["stderr_tail"]))
    if failed:
        return 1
    return 3 if a.check and not result.get("target_met") else 0


if __name__ == "__main__":
    sys.exit(main(args_of(sys.argv[1:])))
