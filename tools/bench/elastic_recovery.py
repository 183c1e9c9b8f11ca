#!/usr/bin/env python3
"""How long an elastic job (parallax.elastic) takes to train again after a node is lost.

Starts one etcd member and NODES daemons with membership on it (default lease, 5 s), one
worker a node training elastically (a dense allreduce of 64 KiB a step, 50 ms of "compute"),
then kills one node's daemon and worker together (the coordinator's node or a member's) and
at once starts a daemon and a worker in their place, as systemd's Restart= would. Each
worker logs the wall time of every committed step; the figure is, on the survivors, the
time from the kill to their first step after the reset (the slowest survivor's: a
synchronous step ends when its slowest worker finishes), and its parts: until the reset
(the loss seen), until the new daemon held an index (the lost one's lease expired), until
the next step. Prints one JSON object.

With --mode survive the daemons run with membership_min_nodes NODES-1 and nothing replaces
the lost node: the figure is the same time on the survivors, training as a world of
NODES-1. Then a node is added (a daemon and a worker started): joined_training_s is the
time from its daemon's start to the first step every worker, the new one included, ran in
the world of NODES again.

  /usr/bin/python3 tools/bench/elastic_recovery.py [--nodes 4] [--runs 3]
      [--victim coordinator|member] [--mode replace|survive] [--lease-s 5] [--build build]
"""
import argparse
import calendar
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYTHON = "/usr/bin/python3"

WORKER = r'''
import json, sys, time
import numpy as np
import parallax.elastic as elastic
log = open(sys.argv[1], "a", buffering=1)
state = elastic.State(params=np.zeros(16384, dtype=np.float32), step=0)

@elastic.run(reset_timeout=120.0)
def train(client, state):
    grad = client.dense("grad", 16384)
    g = np.ones(16384, dtype=np.float32)
    while state.step < int(sys.argv[2]):
        grad.allreduce(g).wait()
        state.params -= 0.001 * g
        state.step += 1
        state.commit()
        log.write(json.dumps({"t": time.time(), "step": state.step, "resets": state.resets,
                              "world": client.world_size})
                  + "\n")
        time.sleep(0.05)

train(state)
'''


def free_ports(n):
    ports = []
    while len(ports) < n:
        port = random.randint(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        if port not in ports:
            ports.append(port)
    return ports


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.02)


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def steps(path):
    return [json.loads(line) for line in read(path).splitlines() if line.strip()]


def log_time(text, pattern):
    """The wall time of the first log line matching pattern (parallaxd's UTC ISO stamps,
    2026-11-29T20:37:40.421Z)."""
    for line in text.splitlines():
        if re.search(pattern, line):
            stamp = line.split(" ", 1)[0]
            return calendar.timegm(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S")) + \
                float("0" + stamp[19:-1])
    return None


def one_run(args, run, scratch):
    etcd_client, etcd_peer = free_ports(2)
    etcd = subprocess.Popen(
        ["etcd", "--data-dir", f"{scratch}/etcd{run}", "--listen-client-urls",
         f"http://127.0.0.1:{etcd_client}", "--advertise-client-urls",
         f"http://127.0.0.1:{etcd_client}", "--listen-peer-urls",
         f"http://127.0.0.1:{etcd_peer}", "--initial-advertise-peer-urls",
         f"http://127.0.0.1:{etcd_peer}", "--initial-cluster",
         f"default=http://127.0.0.1:{etcd_peer}", "--log-level", "warn"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    def etcd_healthy():
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{etcd_client}/health", timeout=1) as r:
                return b"true" in r.read()
        except OSError:
            return False

    wait_for(etcd_healthy, 30, "etcd")
    name = f"recovery-{uuid.uuid4().hex[:6]}"
    url = f"etcd://127.0.0.1:{etcd_client}/bench/{name}"
    listens = [f"127.0.0.1:{p}" for p in free_ports(args.nodes)]
    daemon = os.path.join(ROOT, args.build, "daemon", "parallaxd")
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "clients", "python"),
               PARALLAX_LIB=os.path.join(ROOT, args.build, "clients", "c", "libparallax.so.1"),
               PARALLAX_JOB=name, PARALLAX_LOCAL_RANK="0", PARALLAX_LOCAL_SIZE="1",
               OMP_NUM_THREADS="1")
    procs = []

    def start(slot, tag):
        sock = f"{scratch}/{tag}.sock"
        log = open(f"{scratch}/{tag}.log", "w")
        survive = ["--membership-min-nodes", str(args.nodes - 1)] if args.mode == "survive" \
            else []
        d = subprocess.Popen([daemon, "--foreground", "--socket", sock, "--cluster", name,
                              "--membership", url, "--node-count", str(args.nodes), "--listen",
                              listens[slot], "--membership-lease-s", str(args.lease_s)] + survive,
                             stdout=log, stderr=subprocess.STDOUT)
        wait_for(lambda: os.path.exists(sock), 60, f"daemon {tag}")
        w = subprocess.Popen([PYTHON, "-c", WORKER, f"{scratch}/{tag}.steps", str(args.steps)],
                             env=dict(env, PARALLAX_SOCKET=sock), stdout=subprocess.DEVNULL,
                             stderr=open(f"{scratch}/{tag}.err", "w"))
        procs.extend([d, w])
        return d, w

    try:
        nodes = [start(slot, f"r{run}n{slot}") for slot in range(args.nodes)]
        tags = [f"r{run}n{slot}" for slot in range(args.nodes)]
        wait_for(lambda: all(len(steps(f"{scratch}/{t}.steps")) >= 20 for t in tags), 120,
                 "20 steps on every node")
        coordinator = next(s for s, t in enumerate(tags)
                           if "coordinator of cluster" in read(f"{scratch}/{t}.log"))
        victim = coordinator if args.victim == "coordinator" else (coordinator + 1) % args.nodes
        d, w = nodes[victim]
        t_kill = time.time()
        w.send_signal(signal.SIGKILL)
        d.send_signal(signal.SIGKILL)
        w.wait()
        d.wait()
        if args.mode == "replace":
            start(victim, f"r{run}n{victim}r")
        survivors = [t for s, t in enumerate(tags) if s != victim]

        def first_step(tag, resets):
            """When the worker's first step after `resets` resets ended (None: not yet)."""
            after = [e["t"] for e in steps(f"{scratch}/{tag}.steps") if e["resets"] == resets]
            return min(after) if after else None

        wait_for(lambda: all(first_step(t, 1) for t in survivors), 120, "a step after the reset")
        again = max(first_step(t, 1) for t in survivors)
        worlds = sorted({e["world"] for t in survivors for e in steps(f"{scratch}/{t}.steps")
                         if e["resets"] == 1})
        seen = [log_time(read(f"{scratch}/{t}.log"), r" lost: ") for t in survivors]
        index_at = log_time(read(f"{scratch}/r{run}n{victim}r.log"), "node index .* assigned")
        formed = [log_time(read(f"{scratch}/{t}.log"), "re-formed under epoch") for t in survivors]

        def since(t0, t):
            return None if t is None else round(t - t0, 2)

        result = {"loss_seen_s": since(t_kill, max(x for x in seen if x) if any(seen) else None),
                  "new_daemon_indexed_s": since(t_kill, index_at),
                  "re_formed_s": since(t_kill, max(x for x in formed if x) if any(formed)
                                       else None),
                  "training_again_s": since(t_kill, again), "world_after": worlds}
        if args.mode == "survive":
            # A node added: from its daemon's start to a step of every worker in the world
            # of NODES again (the survivors' second reset, the new worker's first run).
            t_join = time.time()
            start(victim, f"r{run}n{victim}j")
            joined = survivors + [f"r{run}n{victim}j"]
            wait_for(lambda: all(first_step(t, 2 if t in survivors else 0) for t in joined),
                     120, "a step with the added node")
            result["joined_training_s"] = since(
                t_join, max(first_step(t, 2 if t in survivors else 0) for t in joined))
        return result
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
            p.wait()
        etcd.kill()
        etcd.wait()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--victim", choices=["coordinator", "member"], default="coordinator")
    parser.add_argument("--mode", choices=["replace", "survive"], default="replace")
    parser.add_argument("--lease-s", type=int, default=5)
    parser.add_argument("--steps", type=int, default=100000)
    parser.add_argument("--build", default="build")
    args = parser.parse_args()
    scratch = tempfile.mkdtemp(prefix="px-elastic-")
    try:
        runs = [one_run(args, run, scratch) for run in range(args.runs)]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    again = [r["training_again_s"] for r in runs]
    summary = {"scenario": "elastic_recovery", "nodes": args.nodes, "victim": args.victim,
               "mode": args.mode, "lease_s": args.lease_s, "runs": runs,
               "training_again_s": {"min": min(again), "max": max(again)}}
    if args.mode == "survive":
        joined = [r["joined_training_s"] for r in runs]
        summary["joined_training_s"] = {"min": min(joined), "max": max(joined)}
    print(json.dumps(summary))


if __name__ == "__main__":
    sys.exit(main())
