#!/usr/bin/env python3
"""Random membership events during the demo's language model, trained elastically.

Starts a 3-member etcd cluster on loopback and NODES daemons with membership on it
(membership_min_nodes MIN, the default lease of 5 s, periodic checkpoints of the sparse
tables every second into a shared directory), one worker a node running
`tools/lm/train.py --elastic` (parallax.elastic). Once every worker has stepped and a
checkpoint exists, it injects EVENTS random events, one at a time:

  kill_node         SIGKILL a member's daemon and its worker together (a node lost)
  kill_coordinator  the same for the coordinator's node
  add_node          a daemon and a worker started on a new address (a node joins)
  kill_etcd_member  SIGKILL one etcd member, started again once the job has gone on

(never fewer than MIN nodes or more than NODES: a kill needs more than MIN, an add fewer
than NODES). After each event it waits until every live worker has committed a step after
it in a new run (after its reset; for an etcd member, any step: nothing resets), a hang
past 120 s counted, checks that the daemons' logs account for it (a kill:
every survivor logged the loss and re-formed; an add: the new daemon is in a formed
cluster and the others re-formed; an etcd member: no loss, no re-formation), then waits
1-3 s. Then it lets the training end and reads the held-out perplexity. Daemons that died
unkilled are crashes. Prints one JSON object; with --events 0 it is the undisturbed run
to compare with.

  /usr/bin/python3 tools/bench/elastic_lm.py [--nodes 4] [--min-nodes 2] [--events 50]
      [--steps 2000] [--seed 1] [--kinds K,K] [--keep] [--build build | --daemon P --lib L]
  px-bench elastic-lm [...]   (the same, with px-bench's build)
"""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from elastic_recovery import ROOT, PYTHON, free_ports, read, steps, wait_for  # noqa: E402

KINDS = ["kill_node", "kill_coordinator", "add_node", "kill_etcd_member"]


class Etcd:
    """A 3-member etcd cluster on loopback; members are killed and started again."""

    def __init__(self, scratch):
        ports = free_ports(6)
        self.clients = [f"127.0.0.1:{ports[i]}" for i in range(3)]
        peers = [f"http://127.0.0.1:{ports[3 + i]}" for i in range(3)]
        initial = ",".join(f"m{i}={peers[i]}" for i in range(3))
        self.argvs = [["etcd", "--name", f"m{i}", "--data-dir", f"{scratch}/etcd{i}",
                       "--listen-client-urls", f"http://{self.clients[i]}",
                       "--advertise-client-urls", f"http://{self.clients[i]}",
                       "--listen-peer-urls", peers[i], "--initial-advertise-peer-urls", peers[i],
                       "--initial-cluster", initial, "--initial-cluster-state", "new",
                       "--log-level", "warn"] for i in range(3)]
        self.procs = [self.start(i) for i in range(3)]
        wait_for(lambda: all(self.healthy(c) for c in self.clients), 60, "etcd")

    def start(self, i):
        return subprocess.Popen(self.argvs[i], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)

    @staticmethod
    def healthy(client):
        try:
            with urllib.request.urlopen(f"http://{client}/health", timeout=1) as r:
                return b"true" in r.read()
        except OSError:
            return False

    def kill(self, i):
        self.procs[i].kill()
        self.procs[i].wait()

    def restart(self, i):
        self.procs[i] = self.start(i)

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()


class Node:
    """A daemon and its worker."""

    def __init__(self, args, scratch, name, url, tag):
        self.tag = tag
        self.log_path = f"{scratch}/{tag}.log"
        self.steps_path = f"{scratch}/{tag}.steps"
        sock = f"{scratch}/{tag}.sock"
        listen = f"127.0.0.1:{free_ports(1)[0]}"
        self.daemon = subprocess.Popen(
            [args.daemon, "--foreground", "--socket",
             sock, "--cluster", name, "--membership", url, "--node-count", str(args.nodes),
             "--membership-min-nodes", str(args.min_nodes), "--listen", listen,
             "--checkpoint-dir", f"{scratch}/checkpoints", "--checkpoint-interval-s", "1"],
            stdout=open(self.log_path, "w"), stderr=subprocess.STDOUT)
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "clients", "python"),
                   PARALLAX_LIB=args.lib,
                   PARALLAX_JOB=name, PARALLAX_LOCAL_RANK="0", PARALLAX_LOCAL_SIZE="1",
                   PARALLAX_SOCKET=sock, OMP_NUM_THREADS="1")
        wait_for(lambda: os.path.exists(sock) or self.daemon.poll() is not None, 90,
                 f"daemon {tag}")
        self.worker = subprocess.Popen(
            [PYTHON, os.path.join(ROOT, "tools", "lm", "train.py"), "--elastic", "--steps",
             str(args.steps), "--step-log", self.steps_path, "--json",
             f"{scratch}/result.json", "--log-every", "100",
             *(["--global-batch", str(args.global_batch)] if args.global_batch else []),
             "--replicas", str(args.replicas)],
            env=env, stdout=open(f"{scratch}/{tag}.out", "w"),
            stderr=open(f"{scratch}/{tag}.err", "w"))
        self.killed = False

    def log(self):
        return read(self.log_path)

    def resets(self):
        """How many resets its worker went through, as its last committed step says."""
        log = steps(self.steps_path)
        return log[-1]["resets"] if log else 0

    def stepped_after(self, t, resets):
        """Its worker committed a step after time t with more than `resets` resets (or, with
        resets None, any step after t)."""
        return any(e["t"] > t and (resets is None or e["resets"] > resets)
                   for e in steps(self.steps_path))

    def kill(self):
        self.killed = True
        for p in (self.worker, self.daemon):
            p.send_signal(signal.SIGKILL)
            p.wait()


def count(text, part):
    return text.count(part)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--min-nodes", type=int, default=2)
    parser.add_argument("--events", type=int, default=50)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--replicas", type=int, default=1, choices=(1, 2),
                        help="the tables' replicas (train.py --replicas): 2 hands a lost "
                             "node's partitions over from a copy instead of the checkpoint")
    parser.add_argument("--global-batch", type=int, default=48,
                        help="sequences per step over all workers (train.py --global-batch; "
                             "divides by 2, 3 and 4); 0: 16 per worker")
    parser.add_argument("--build", default="build")
    parser.add_argument("--daemon", help="parallaxd (default: BUILD/daemon/parallaxd)")
    parser.add_argument("--lib", help="libparallax.so.1 (default: BUILD's)")
    parser.add_argument("--keep", action="store_true", help="keep the logs (printed path)")
    parser.add_argument("--json", action="store_true", help="(it always prints JSON)")
    parser.add_argument("--kinds", default=",".join(KINDS), help="the events drawn from")
    args = parser.parse_args()
    args.daemon = args.daemon or os.path.join(ROOT, args.build, "daemon", "parallaxd")
    args.lib = args.lib or os.path.join(ROOT, args.build, "clients", "c", "libparallax.so.1")
    rng = random.Random(args.seed)
    scratch = tempfile.mkdtemp(prefix="px-elastic-lm-")
    os.makedirs(f"{scratch}/checkpoints")
    etcd = Etcd(scratch)
    name = f"lm-{uuid.uuid4().hex[:6]}"
    url = f"etcd://{','.join(etcd.clients)}/bench/{name}"
    all_nodes = []
    t_start = time.time()
    events = []
    try:
        live = [Node(args, scratch, name, url, f"n{i}") for i in range(args.nodes)]
        all_nodes.extend(live)
        wait_for(lambda: all(steps(n.steps_path) for n in live), 300, "a step on every node")
        wait_for(lambda: any(f.endswith(".manifest")
                             for _, _, fs in os.walk(f"{scratch}/checkpoints") for f in fs),
                 120, "a checkpoint")

        def training_over():
            return any(n.worker.poll() is not None for n in live)

        for i in range(args.events):
            if training_over():
                break
            kinds = ["kill_etcd_member"]
            if len(live) > args.min_nodes:
                kinds += ["kill_node", "kill_coordinator"]
            if len(live) < args.nodes:
                kinds.append("add_node")
            kinds = [k for k in kinds if k in args.kinds.split(",")]
            if not kinds:
                break
            kind = rng.choice(kinds)
            before = {n.tag: (count(n.log(), " lost: "), count(n.log(), "re-formed under"))
                      for n in live}
            resets = {n.tag: n.resets() for n in live}
            at_step = max((steps(n.steps_path) or [{"step": 0}])[-1]["step"] for n in live)
            t_event = time.time()
            what = kind
            if kind in ("kill_node", "kill_coordinator"):
                coordinators = [n for n in live if "coordinator of cluster" in n.log()
                                and n.log().rfind("coordinator of cluster") >=
                                n.log().rfind("coordinator is node")]
                coordinator = coordinators[-1] if coordinators else live[0]
                others = [n for n in live if n is not coordinator]
                victim = coordinator if kind == "kill_coordinator" else rng.choice(others)
                victim.kill()
                live.remove(victim)
                what += f" {victim.tag}"
            elif kind == "add_node":
                node = Node(args, scratch, name, url, f"n{len(all_nodes)}")
                all_nodes.append(node)
                live.append(node)
                what += f" {node.tag}"
            else:
                member = rng.randrange(3)
                etcd.kill(member)
                what += f" {member}"
            # Training again: a kill or an add resets every worker (a step already under way
            # may still end after the event: it does not count), and the added one steps; an
            # etcd member lost changes nothing, so any step will do.
            def again(n):
                if kind == "kill_etcd_member" or n.tag not in resets:
                    return n.stepped_after(t_event, None)
                return n.stepped_after(t_event, resets[n.tag])

            recovered = True
            try:
                wait_for(lambda: training_over() or all(again(n) for n in live),
                         120, f"training after {what}")
            except RuntimeError:
                recovered = False
            recovered_s = round(time.time() - t_event, 2)
            if kind == "kill_etcd_member":
                time.sleep(1.0)  # the job goes on meanwhile
                etcd.restart(member)
                wait_for(lambda: Etcd.healthy(etcd.clients[member]), 60, "the etcd member back")
            # What the logs say about it.
            if kind == "kill_etcd_member":
                accounted = all(
                    (count(n.log(), " lost: "), count(n.log(), "re-formed under")) == before[n.tag]
                    for n in live)
            elif kind == "add_node":
                accounted = "ready: " in live[-1].log() and all(
                    count(n.log(), "re-formed under") > before[n.tag][1] for n in live[:-1])
            else:
                accounted = all(count(n.log(), " lost: ") > before[n.tag][0] and
                                count(n.log(), "re-formed under") > before[n.tag][1]
                                for n in live)
            worlds = sorted({e["world"] for n in live for e in steps(n.steps_path)
                             if e["t"] > t_event})
            events.append({"event": what, "at_step": at_step, "recovered": recovered,
                           "recovered_s": recovered_s, "accounted": accounted,
                           "worlds_after": worlds})
            print(json.dumps(events[-1]), file=sys.stderr, flush=True)
            time.sleep(rng.uniform(1.0, 3.0))
        for n in live:
            try:
                n.worker.wait(timeout=3600)
            except subprocess.TimeoutExpired:
                n.worker.kill()
        crashes = [n.tag for n in all_nodes if not n.killed and n.daemon.poll() is not None]
        worker_failures = [n.tag for n in live if n.worker.returncode != 0]
        result = json.loads(read(f"{scratch}/result.json") or "{}")
        by_kind = {k: sum(1 for e in events if e["event"].startswith(k)) for k in KINDS}
        summary = {
            "scenario": "elastic_lm", "nodes": args.nodes, "min_nodes": args.min_nodes,
            "steps": args.steps, "global_batch": args.global_batch, "seed": args.seed,
            "replicas": args.replicas,
            "events": len(events), "by_kind": by_kind,
            "hangs": sum(1 for e in events if not e["recovered"]),
            "unaccounted": [e["event"] for e in events if not e["accounted"]],
            "daemon_crashes": crashes, "worker_failures": worker_failures,
            "recovered_s": {"min": min((e["recovered_s"] for e in events), default=None),
                            "max": max((e["recovered_s"] for e in events), default=None)},
            "perplexity": result.get("perplexity"), "resets": result.get("resets"),
            "worlds": result.get("worlds"),
            "tables_restored_at": result.get("tables_restored_at"),
            "seconds": round(time.time() - t_start, 1), "event_log": events}
        print(json.dumps(summary))
        for tag in worker_failures:
            print(f"{tag}: {read(f'{scratch}/{tag}.err')[-2000:]}", file=sys.stderr)
    finally:
        for n in all_nodes:
            for p in (n.worker, n.daemon):
                if p.poll() is None:
                    p.kill()
                p.wait()
        etcd.stop()
        if args.keep:
            print(f"logs kept in {scratch}", file=sys.stderr)
        else:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
