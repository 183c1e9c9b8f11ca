"""torch.distributed's "parallax" backend against real daemons and real worker processes
(tests/c10dworker.py): every collective torch routes to a backend, every dtype and op,
against references computed by each rank alone; torch's own DistributedDataParallel over
"parallax" against the same over "gloo"; and bad input, which must raise within the
deadline, never hang.

On 1 node x 3 workers (one daemon) and 2 nodes x 2 workers (px-cluster over libfabric),
the latter with torch ranks in the reverse of the daemons' order.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from conftest import HERE, run_cluster, run_workers

WORKER = "c10dworker.py"


# The stores and markers of every test under one scratch folder, removed when the tests end.
SCRATCH = tempfile.mkdtemp(prefix="pxc10d-")
atexit.register(shutil.rmtree, SCRATCH, True)


def store_env():
    return {"PXPY_STORE": os.path.join(tempfile.mkdtemp(dir=SCRATCH), "store")}


def workers(daemon, scenario, n, *args, timeout=240):
    return run_workers(daemon, scenario, n, *args, timeout=timeout, extra_env=store_env(),
                       worker=WORKER)


def cluster(scenario, *args, nodes=2, per_node=2, timeout=300):
    return run_cluster(nodes, per_node, scenario, *args, timeout=timeout,
                       extra_env=store_env(), worker=WORKER)


def assert_collectives(results, world):
    assert len(results) == world
    assert sorted(r["rank"] for r in results) == list(range(world))
    for r in results:
        assert r["ok"] and r["world"] == world, r
        assert r["checked"] == 396, r  # every collective x dtype x op x size below
    return {r["rank"]: r["daemon_rank"] for r in results}


def test_collectives_one_node(daemon):
    assert_collectives(workers(daemon, "collectives", 3), 3)


def test_collectives_two_nodes_reversed_ranks():
    ranks = assert_collectives(cluster("collectives", "order=reversed"), 4)
    assert ranks == {0: 3, 1: 2, 2: 1, 3: 0}, ranks


# "exact": torch's DDP divides each gradient by the world size before the allreduce, so
# its sums are exact in any order where that division is (a power of two: 4 workers).
@pytest.mark.parametrize("data,n", [("exact", 4), ("float", 3)])
def test_ddp_matches_gloo_one_node(daemon, data, n):
    for r in workers(daemon, "ddp", n, f"data={data}"):
        assert r["moved"] > 0.01, r
        if data == "exact":
            assert r["equal"], r        # every sum is exact: bitwise the same parameters
        else:
            assert r["worst_relative"] <= 1e-6, r


@pytest.mark.parametrize("data", ["exact", "float"])
def test_ddp_matches_gloo_two_nodes(data):
    for r in cluster("ddp", f"data={data}", "order=reversed"):
        assert r["moved"] > 0.01, r
        if data == "exact":
            assert r["equal"], r
        else:
            assert r["worst_relative"] <= 1e-6, r


@pytest.mark.parametrize("what", ["dtype", "size"])
def test_mismatched_collective_fails_every_rank_at_once(daemon, what):
    results = workers(daemon, "mismatch", 3, f"what={what}", "timeout=60")
    for r in results:
        assert r["error"], r
        assert "PX_ERR_MISMATCH" in r["error"], r["error"]
        odd = "f64[10]" if what == "dtype" else "f32[11]"
        assert "f32[10] sum by worker" in r["error"] and odd in r["error"], r["error"]
        assert "c10d." in r["error"], r["error"]          # names the variable
        assert r["seconds"] < 30, r                      # at once, not at the deadline


def test_rank_that_never_joins_fails_the_others_at_the_deadline(daemon):
    results = workers(daemon, "late-rank", 3, "timeout=5", "sleep=9", timeout=60)
    for r in results:
        if r.get("skipped"):
            continue
        assert r["error"] and "did not join" in r["error"], r
        assert 4 < r["seconds"] < 15, r


def test_daemon_killed_mid_collective(daemon):
    marker = os.path.join(tempfile.mkdtemp(dir=SCRATCH), "go")
    env = dict(store_env(), PXPY_MARKER=marker)
    procs = []
    base = daemon.env()
    for r in range(2):
        e = dict(base, **env, PARALLAX_LOCAL_RANK=str(r), PARALLAX_LOCAL_SIZE="2")
        procs.append(subprocess.Popen([sys.executable, os.path.join(HERE, WORKER),
                                       "daemon-killed", "timeout=60"], env=e,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    deadline = time.monotonic() + 60
    while not os.path.exists(marker):
        assert time.monotonic() < deadline, "the workers never started their collectives"
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        time.sleep(0.05)
    daemon.proc.send_signal(signal.SIGKILL)
    for p in procs:
        out, err = p.communicate(timeout=60)
        result = json.loads(out.strip().splitlines()[-1])
        assert result["error"], (result, err)
        assert "parallax backend" in result["error"], result["error"]
        assert result["seconds"] < 55, result
