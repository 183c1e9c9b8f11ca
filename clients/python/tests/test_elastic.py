"""parallax.elastic with real daemons whose membership is on a real etcd (Debian's
etcd-server, started here): a node lost mid-training (its daemon and its worker killed),
a spare daemon (started beyond node_count, waiting for an index) takes its place with a new
worker, and the job goes on from its last commit to
the very parameters an undisturbed run reaches; its sparse table comes back from the
newest periodic checkpoint, missing exactly the push steps since that checkpoint. With
membership_min_nodes below the node count, the survivors go on alone: sums and means over
the smaller world from the step they resumed at, the table resharded over them from the
checkpoint."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
import uuid

import numpy as np
import pytest

from conftest import HERE, PYTHON, Daemon

WORKER = os.path.join(HERE, "elasticworker.py")
STEPS = 60


def free_ports(n: int) -> list:
    """Free ports below the ephemeral range (as the C++ harness picks them)."""
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


class Etcd:
    """One etcd member on loopback with its data in a scratch directory."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="pxpy-etcd-")
        client, peer = free_ports(2)
        self.endpoint = f"127.0.0.1:{client}"
        self.log = open(os.path.join(self.dir, "etcd.log"), "w")
        self.proc = subprocess.Popen(
            [shutil.which("etcd") or "/usr/bin/etcd", "--data-dir", os.path.join(self.dir, "d"),
             "--listen-client-urls", f"http://{self.endpoint}", "--advertise-client-urls",
             f"http://{self.endpoint}", "--listen-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}", "--initial-cluster",
             f"default=http://127.0.0.1:{peer}", "--log-level", "warn"],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://{self.endpoint}/health", timeout=1) as r:
                    if json.loads(r.read()).get("health") == "true":
                        return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("etcd did not start")
            time.sleep(0.1)

    def stop(self):
        self.proc.kill()
        self.proc.wait(10)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def etcd():
    e = Etcd()
    yield e
    e.stop()


class ElasticCluster:
    """The daemons of one test's cluster on `etcd`: a job name of its own, a control port per
    slot, a lease of 2 s and a periodic checkpoint every second into one shared folder."""

    def __init__(self, etcd: Etcd, tmp_path, prefix: str, slots: int, *flags: str):
        self.name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        self.url = f"etcd://{etcd.endpoint}/parallax-tests/{self.name}"
        self.listens = [f"127.0.0.1:{p}" for p in free_ports(slots)]
        self.checkpoints = str(tmp_path / "checkpoints")
        os.makedirs(self.checkpoints)
        self.flags = flags

    def start(self, slot: int, wait: bool = True) -> Daemon:
        return Daemon("--cluster", self.name, "--membership", self.url, "--listen",
                      self.listens[slot], "--membership-lease-s", "2", "--peer-silence-ms",
                      "6000", "--checkpoint-dir", self.checkpoints, "--checkpoint-interval-s",
                      "1", *self.flags, wait=wait)


def start_worker(daemon: Daemon, job: str, progress: str, steps: int = STEPS,
                 replicas: int = 1, route: str = "hybrid") -> subprocess.Popen:
    env = daemon.env(job)
    env.update(PARALLAX_LOCAL_RANK="0", PARALLAX_LOCAL_SIZE="1",
               ELASTIC_TABLE_REPLICAS=str(replicas), ELASTIC_TABLE_ROUTE=route)
    return subprocess.Popen([PYTHON, WORKER, str(steps), progress], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def progress(path: str) -> int:
    try:
        with open(path) as f:
            return int(f.read() or 0)
    except (OSError, ValueError):
        return 0


def wait_for_checkpoint_and_step(worker, progress_file: str, checkpoints: str, step: int):
    """Until the worker committed `step` and a periodic checkpoint of the table exists."""
    deadline = time.monotonic() + 60
    while progress(progress_file) < step or not any(
            f.endswith(".manifest") for _, _, fs in os.walk(checkpoints) for f in fs):
        assert time.monotonic() < deadline, worker.stderr.read() if worker.poll() \
            is not None else "no progress"
        time.sleep(0.05)


def lose_node(worker, daemon, daemon_after: float = 0) -> None:
    """A node lost: its daemon and its worker die together (the daemon daemon_after seconds
    after the worker)."""
    worker.send_signal(signal.SIGKILL)
    time.sleep(daemon_after)
    daemon.proc.send_signal(signal.SIGKILL)
    worker.wait(10)


def stop_all(workers, daemons) -> None:
    for w in workers:
        if w.poll() is None:
            w.kill()
    for d in daemons:
        d.stop()


def results_of(workers) -> list:
    results = []
    for w in workers:
        out, err = w.communicate(timeout=150)
        assert w.returncode == 0, err
        results.append({**json.loads(out.strip().splitlines()[-1]), "stderr": err})
    return results


def expected_table(weights: dict) -> np.ndarray:
    """The table after push steps {s: the workers' summed weight}: step s pushed weight x s
    into row (s - 1) % 8, SGD with lr 1."""
    rows = np.zeros((8, 4))
    for s, weight in weights.items():
        rows[(s - 1) % 8] -= weight * s
    return rows


def test_elastic_job_goes_on_after_a_node_is_lost_and_replaced(etcd, tmp_path):
    """Two nodes and a spare daemon (beyond node_count, it waits for an index): node 1 lost,
    the spare takes its index once its lease expires, and a worker started on it goes on
    with the survivor."""
    cluster = ElasticCluster(etcd, tmp_path, "elastic", 3, "--node-count", "2")
    name, checkpoints, start_daemon = cluster.name, cluster.checkpoints, cluster.start

    daemons = [start_daemon(0), start_daemon(1)]
    files = [str(tmp_path / f"progress{i}") for i in range(3)]
    workers = [start_worker(daemons[0], name, files[0]), start_worker(daemons[1], name, files[1])]
    try:
        # The spare: every index is held, so it waits (and serves no worker yet).
        daemons.append(start_daemon(2, wait=False))
        deadline = time.monotonic() + 20
        while "node indices under" not in daemons[2].log_text():
            assert daemons[2].proc.poll() is None and time.monotonic() < deadline, \
                daemons[2].log_text()
            time.sleep(0.05)
        # Step 10 at least, and a periodic checkpoint of the table to come back from.
        wait_for_checkpoint_and_step(workers[1], files[1], checkpoints, 10)
        lose_node(workers[1], daemons[1])
        lost_at = progress(files[0])
        # The spare takes the freed index once the lost one's lease expires; a worker on it
        # starts from the synced state.
        daemons[2].wait_started(30)
        workers.append(start_worker(daemons[2], name, files[2]))
        results = results_of([workers[0], workers[2]])
    finally:
        stop_all(workers, daemons)

    expected = -0.001 * 3 * sum(range(1, STEPS + 1))  # ranks 0 and 1: (1 + 2) x each step
    expected_mean = expected / 2
    survivor, replacement = results
    assert lost_at < STEPS, "the job ended before the loss: make it longer"
    for r in results:
        assert r["step"] == STEPS, r
        assert np.allclose(r["params"], expected, rtol=0, atol=1e-9), (r["params"][0], expected)
        assert np.allclose(r["mean_params"], expected_mean, rtol=0, atol=1e-9)
    assert survivor["resets"] == 1, survivor["stderr"]
    assert "parallax.elastic: reset 1 after: PX_ERR_PEER_LOST" in survivor["stderr"]
    assert survivor["worlds"] == [2, 2], survivor
    assert replacement["resets"] == 0 and replacement["worlds"] == [2], replacement

    # The table: the first run's push steps up to the newest checkpoint, then every step from
    # where the reset resumed. Both workers saw the same (resume step, restored steps).
    first, after = survivor["runs"]
    assert first == [0, 0], survivor["runs"]
    assert replacement["runs"] == [after], (survivor["runs"], replacement["runs"])
    resumed, restored = after
    print(f"lost at step {lost_at}; resumed from step {resumed}; table restored at {restored}")
    assert 0 < restored and resumed <= STEPS, after
    applied = list(range(1, restored + 1)) + list(range(resumed + 1, STEPS + 1))
    expected_rows = expected_table({s: 3 for s in applied})  # ranks 0 and 1: 1 + 2
    for r in results:
        assert np.allclose(r["table"], expected_rows, rtol=0, atol=1e-3), (r["table"], after)


@pytest.mark.parametrize("nodes, replicas, route, worker_first",
                         [(3, 1, "hybrid", False), (2, 1, "hybrid", False), (3, 2, "ps", False),
                          (3, 2, "ps", True), (3, 1, "allgatherv", False)])
def test_elastic_job_goes_on_on_the_survivors_of_a_lost_node(etcd, tmp_path, nodes, replicas,
                                                             route, worker_first):
    """`nodes` nodes, membership_min_nodes one fewer: one lost for good, the others re-form
    without waiting for a replacement (with 2 nodes, the survivor goes on alone: an epoch of
    one) and the job goes on as a world of nodes - 1 from its last commit. With 2 replicas
    the lost node's partitions come from the next node's copy, and on the allgatherv route
    every survivor holds the whole table: either way the table is handed over rather than
    restored from the checkpoint. worker_first: the lost node's worker dies 0.3 s before its
    daemon, which reports it (the job breaks) before the node is lost."""
    cluster = ElasticCluster(etcd, tmp_path, "survivors", nodes, "--node-count", str(nodes),
                             "--membership-min-nodes", str(nodes - 1))
    name, checkpoints = cluster.name, cluster.checkpoints
    daemons = [cluster.start(slot) for slot in range(nodes)]
    files = [str(tmp_path / f"progress{i}") for i in range(nodes)]
    workers = [start_worker(daemons[i], name, files[i], replicas=replicas, route=route)
               for i in range(nodes)]
    last = nodes - 1
    try:
        wait_for_checkpoint_and_step(workers[last], files[last], checkpoints, 10)
        lose_node(workers[last], daemons[last], 0.3 if worker_first else 0)
        lost_at = progress(files[0])
        results = results_of(workers[:last])
    finally:
        stop_all(workers, daemons)

    assert lost_at < STEPS, "the job ended before the loss: make it longer"
    runs = results[0]["runs"]
    assert len(runs) == 2 and runs[0] == [0, 0], runs
    resumed, restored = runs[1]
    print(f"lost at step {lost_at}; resumed from step {resumed}; table restored at {restored}")
    assert 0 < restored <= resumed < STEPS, runs
    if replicas > 1 or route == "allgatherv":  # handed over: at most the step under way and
        assert restored >= resumed - 2, runs   # the one before it, as at a join
    # Step s's gradient is s x (rank + 1): steps up to the resumed one summed over ranks
    # 0..nodes-1, the rest over the survivors' ranks 0..nodes-2.
    weight_before, weight_after = nodes * (nodes + 1) // 2, (nodes - 1) * nodes // 2
    before, after = range(1, resumed + 1), range(resumed + 1, STEPS + 1)
    expected = -0.001 * (weight_before * sum(before) + weight_after * sum(after))
    expected_mean = -0.001 * (weight_before / nodes * sum(before) +
                              weight_after / (nodes - 1) * sum(after))
    for r in results:
        assert r["runs"] == runs, (r["runs"], runs)
        assert r["step"] == STEPS and r["resets"] == 1, r["stderr"]
        assert r["worlds"] == [nodes, nodes - 1], r
        assert "parallax.elastic: reset 1 after: PX_ERR_PEER_LOST" in r["stderr"]
        assert np.allclose(r["params"], expected, rtol=0, atol=1e-9), (r["params"][0], expected)
        assert np.allclose(r["mean_params"], expected_mean, rtol=0, atol=1e-9), \
            (r["mean_params"][0], expected_mean)
        # The table, resharded over the survivors from the checkpoint: the push steps up to
        # it (every worker), then those from the resumed step on (the survivors); the ones
        # between are lost.
        weights = {s: weight_before for s in range(1, restored + 1)}
        weights.update({s: weight_after for s in after})
        assert np.allclose(r["table"], expected_table(weights), rtol=0, atol=1e-3), \
            (r["table"], runs)


def wait_for_progress(worker, progress_file: str, step: int) -> None:
    deadline = time.monotonic() + 60
    while progress(progress_file) < step:
        assert time.monotonic() < deadline, worker.stderr.read() if worker.poll() \
            is not None else "no progress"
        time.sleep(0.05)


def test_elastic_job_resets_with_membership_changed_when_a_node_joins(etcd, tmp_path):
    """3 nodes, membership_min_nodes 2: one lost (PX_ERR_PEER_LOST), the two go on; a daemon
    started takes the free index, the cluster re-forms on three, and the two survivors'
    run ends with PX_ERR_MEMBERSHIP (nothing lost): they reset again, and a worker on the
    new node joins them from the synced state."""
    steps = 200
    cluster = ElasticCluster(etcd, tmp_path, "joins", 3, "--node-count", "3",
                             "--membership-min-nodes", "2")
    name, checkpoints, start_daemon = cluster.name, cluster.checkpoints, cluster.start

    daemons = [start_daemon(slot) for slot in range(3)]
    files = [str(tmp_path / f"progress{i}") for i in range(4)]
    workers = [start_worker(daemons[i], name, files[i], steps) for i in range(3)]
    try:
        wait_for_checkpoint_and_step(workers[2], files[2], checkpoints, 10)
        lose_node(workers[2], daemons[2])
        lost_at = progress(files[0])
        # Training again on two (steps past the loss are committed only after the re-form).
        wait_for_progress(workers[0], files[0], lost_at + 5)
        joined_at = progress(files[0])
        assert joined_at < steps - 50, "too close to the end for a join: make it longer"
        daemons.append(start_daemon(2))
        workers.append(start_worker(daemons[3], name, files[3], steps))
        results = results_of([workers[0], workers[1], workers[3]])
    finally:
        stop_all(workers, daemons)

    assert joined_at < steps, "the job ended before the join: make it longer"
    survivors, newcomer = results[:2], results[2]
    runs = survivors[0]["runs"]
    assert len(runs) == 3 and runs[0] == [0, 0], runs
    first_resume, second_resume = runs[1][0], runs[2][0]
    print(f"lost at {lost_at}, resumed from {first_resume}; joined at {joined_at}, resumed "
          f"from {second_resume}")
    assert 0 < first_resume <= second_resume < steps, runs
    # Ranks 0-2 (1 + 2 + 3) up to the first resume, 0-1 (1 + 2) to the second, 0-2 after.
    phases = [(range(1, first_resume + 1), 6, 3),
              (range(first_resume + 1, second_resume + 1), 3, 2),
              (range(second_resume + 1, steps + 1), 6, 3)]
    expected = -0.001 * sum(weight * sum(r) for r, weight, _ in phases)
    expected_mean = -0.001 * sum(weight / n * sum(r) for r, weight, n in phases)
    for r in survivors:
        assert r["runs"] == runs, (r["runs"], runs)
        assert r["step"] == steps and r["resets"] == 2, r["stderr"]
        assert r["worlds"] == [3, 2, 3], r
        assert "parallax.elastic: reset 1 after: PX_ERR_PEER_LOST" in r["stderr"]
        assert "parallax.elastic: reset 2 after: PX_ERR_MEMBERSHIP" in r["stderr"], r["stderr"]
        assert re.search(r"re-forms on 3 nodes \(node 2 \([^)]*\) joined\)", r["stderr"]), \
            r["stderr"]
    for r in results:
        assert np.allclose(r["params"], expected, rtol=0, atol=1e-9), (r["params"][0], expected)
        assert np.allclose(r["mean_params"], expected_mean, rtol=0, atol=1e-9), \
            (r["mean_params"][0], expected_mean)
    assert newcomer["resets"] == 0 and newcomer["worlds"] == [3], newcomer
    assert newcomer["runs"] == [runs[2]], (newcomer["runs"], runs)


def test_elastic_job_grows_past_node_count_up_to_max_nodes(etcd, tmp_path):
    """node_count 2, membership_max_nodes 3: the first epoch forms with two nodes; a third
    daemon started mid-job takes index 2, the cluster re-forms on three and the job resets
    (PX_ERR_MEMBERSHIP) and goes on as a world of 3, its table resharded over three."""
    steps = 150
    cluster = ElasticCluster(etcd, tmp_path, "grows", 3, "--node-count", "2",
                             "--membership-max-nodes", "3")
    name, checkpoints, start_daemon = cluster.name, cluster.checkpoints, cluster.start

    daemons = [start_daemon(0), start_daemon(1)]
    files = [str(tmp_path / f"progress{i}") for i in range(3)]
    workers = [start_worker(daemons[i], name, files[i], steps) for i in range(2)]
    try:
        wait_for_checkpoint_and_step(workers[1], files[1], checkpoints, 10)
        joined_at = progress(files[0])
        assert joined_at < steps - 50, "too close to the end for a join: make it longer"
        daemons.append(start_daemon(2))
        workers.append(start_worker(daemons[2], name, files[2], steps))
        results = results_of(workers)
    finally:
        stop_all(workers, daemons)

    assert joined_at < steps, "the job ended before the join: make it longer"
    first, newcomer = results[0], results[2]
    runs = first["runs"]
    assert len(runs) == 2 and runs[0] == [0, 0], runs
    resumed, restored = runs[1]
    print(f"joined at {joined_at}; resumed from {resumed}; table restored at {restored}")
    assert 0 < restored <= resumed < steps, runs
    # Handed over from the run the join ended, not the checkpoint: at most the step under
    # way (pushed, maybe not committed) and the one before it (pushed, not yet applied).
    assert restored >= resumed - 2, runs
    # Ranks 0-1 (1 + 2) up to the resumed step, 0-2 (1 + 2 + 3) after it.
    before, after = range(1, resumed + 1), range(resumed + 1, steps + 1)
    expected = -0.001 * (3 * sum(before) + 6 * sum(after))
    expected_mean = -0.001 * (1.5 * sum(before) + 2 * sum(after))
    weights = {s: 3 for s in range(1, restored + 1)}
    weights.update({s: 6 for s in after})
    for r in results[:2]:
        assert r["runs"] == runs, (r["runs"], runs)
        assert r["step"] == steps and r["resets"] == 1, r["stderr"]
        assert r["worlds"] == [2, 3], r
        assert "parallax.elastic: reset 1 after: PX_ERR_MEMBERSHIP" in r["stderr"], r["stderr"]
    for r in results:
        assert np.allclose(r["params"], expected, rtol=0, atol=1e-9), (r["params"][0], expected)
        assert np.allclose(r["mean_params"], expected_mean, rtol=0, atol=1e-9), \
            (r["mean_params"][0], expected_mean)
        assert np.allclose(r["table"], expected_table(weights), rtol=0, atol=1e-3), \
            (r["table"], runs)
    assert newcomer["resets"] == 0 and newcomer["worlds"] == [3], newcomer
    assert newcomer["runs"] == [runs[1]], (newcomer["runs"], runs)


def test_elastic_run_gives_up_after_reset_timeout_and_names_bad_values(tmp_path):
    """No daemon to reach: run re-raises once reset_timeout has passed (it does not count
    the failed connects as resets); an unknown State value is a clear AttributeError."""
    import parallax
    import parallax.elastic as elastic

    state = elastic.State(step=0)
    with pytest.raises(AttributeError, match="State has no value 'missing'"):
        state.missing

    @elastic.run(reset_timeout=1.0, socket=str(tmp_path / "nobody.sock"), job="j",
                 local_rank=0, local_size=1)
    def train(client, state):
        raise AssertionError("never reached: there is no daemon")

    t0 = time.monotonic()
    with pytest.raises(parallax.ConnectError):
        train(state)
    assert 1.0 <= time.monotonic() - t0 < 10
    assert state.resets == 0
