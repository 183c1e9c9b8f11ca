"""Observability with real daemons and real workers: the Prometheus endpoint (scraped over
HTTP, parsed with Debian's prometheus_client), every pxctl subcommand with --json, the
timeline, the stall report, on one node and on a 2-node cluster."""
import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import time

import pytest

from conftest import (PXCTL, TEST_WORKER, Workers, deadline_loop, metric, pxctl)

OPS = "parallax_operations_total"
BYTES = "parallax_operation_bytes_total"


def delta(before, after, name, **labels):
    return metric(after, name, **labels) - metric(before, name, **labels)


def wait_for_files(paths, seconds=60):
    for _ in deadline_loop(seconds, " ".join(paths)):
        if all(os.path.exists(p) for p in paths):
            return


def test_metrics_count_dense_and_sparse_operations_exactly(daemons, scratch):
    d = daemons.start("single")
    assert d.status["metrics_url"].startswith("http://127.0.0.1:")
    before = d.metrics()
    # 2 workers x 5 allreduces of 1000 f32, then one barrier.
    Workers([d], "dense", 2, ["dense", "5", "1000"], scratch).wait()
    after = d.metrics()
    assert delta(before, after, OPS, route="allreduce", operation="allreduce") == 5
    assert delta(before, after, BYTES, route="allreduce", operation="allreduce") == 5 * 1000 * 4 * 2
    assert delta(before, after, OPS, route="barrier", operation="barrier") == 1
    assert delta(before, after, "parallax_step_latency_seconds_count", route="allreduce") == 5
    assert delta(before, after, "parallax_step_wait_seconds_count", route="allreduce") == 5
    assert metric(after, "parallax_step_latency_seconds_bucket", route="allreduce", le="+Inf") == 5
    assert metric(after, "parallax_request_errors_total", status="PX_ERR_TIMEOUT") == 0
    assert metric(after, "parallax_operation_failures_total", route="allreduce",
                  operation="allreduce") == 0

    # 2 workers x 4 steps pulling and pushing rows 0..49 of a 1000 x 8 table (route ps).
    before = after
    Workers([d], "sparse", 2, ["sparse", "4", "1000", "8", "50"], scratch).wait()
    after = d.metrics()
    assert delta(before, after, OPS, route="ps", operation="pull") == 4
    assert delta(before, after, OPS, route="ps", operation="push") == 4
    # A step's bytes: every worker's rows x (8 index bytes + 8 x 4 value bytes).
    assert delta(before, after, BYTES, route="ps", operation="pull") == 4 * 2 * 50 * (8 + 32)
    assert delta(before, after, BYTES, route="ps", operation="push") == 4 * 2 * 50 * (8 + 32)
    assert metric(after, "parallax_workers_connected") == 0
    assert metric(after, "parallax_cluster_nodes") == 1
    assert metric(after, "parallax_cluster_nodes_up") == 1
    assert metric(after, "parallax_metrics_stale") == 0


def test_per_variable_metrics_alpha_and_job_gauges_while_workers_hold(daemons, scratch):
    d = daemons.start("hold")
    workers = Workers([d], "hold", 2, ["hold", scratch], scratch)
    wait_for_files([os.path.join(scratch, "ready.%d" % r) for r in range(2)])
    m = d.metrics()
    assert metric(m, "parallax_workers_connected") == 2
    assert metric(m, "parallax_jobs", state="running") == 1
    assert metric(m, "parallax_variables", kind="dense") == 1
    assert metric(m, "parallax_variables", kind="sparse") == 1
    emb = dict(job="hold", variable="emb", kind="sparse")
    # Each worker pulled rows 0..9 of 100 once: alpha = 20 / (1 step x 2 workers x 100 rows).
    assert metric(m, "parallax_variable_alpha", **emb) == pytest.approx(0.1)
    assert metric(m, "parallax_variable_unique_alpha", **emb) == pytest.approx(0.1)
    assert metric(m, "parallax_variable_rows_pulled_total", **emb) == 20
    assert metric(m, "parallax_variable_rows_unique_total", **emb) == 10
    grad = dict(job="hold", variable="grad", kind="dense")
    assert metric(m, "parallax_variable_operations_total", **grad) == 1
    assert metric(m, "parallax_variable_bytes_total", **grad) == 16 * 4 * 2
    assert metric(m, "parallax_variables_unlabeled") == 0
    open(os.path.join(scratch, "stop"), "w").close()
    workers.wait()


def test_metrics_cap_per_variable_series(daemons, scratch):
    d = daemons.start("capped", ["--config", write_config(scratch, "[metrics]\nmax_variables = 1\n")])
    workers = Workers([d], "hold", 2, ["hold", scratch], scratch)
    wait_for_files([os.path.join(scratch, "ready.%d" % r) for r in range(2)])
    m = d.metrics()
    assert metric(m, "parallax_variables_unlabeled") == 1
    labelled = [k for k in m if k[0] == "parallax_variable_operations_total"]
    assert len(labelled) == 1
    open(os.path.join(scratch, "stop"), "w").close()
    workers.wait()


def write_config(scratch, text):
    path = os.path.join(scratch, "parallaxd.toml")
    with open(path, "w") as f:
        f.write(text)
    return path


def test_errors_by_kind_count_failed_requests(daemons, scratch):
    # px_test_worker's abi13-stall: local rank 1 never submits; step_stall_ms fails rank 0's
    # allreduce with PX_ERR_TIMEOUT.
    d = daemons.start("errors", ["--step-stall-ms", "500"])
    before = d.metrics()
    Workers([d], "stall", 2, ["abi13-stall"], scratch, program=TEST_WORKER).wait()
    after = d.metrics()
    assert delta(before, after, "parallax_request_errors_total", status="PX_ERR_TIMEOUT") == 1
    assert delta(before, after, "parallax_request_errors_total", status="PX_ERR_PEER_LOST") == 0


def test_pxctl_every_subcommand_on_one_node(daemons, scratch):
    d = daemons.start("pxctl")
    workers = Workers([d], "hold", 2, ["hold", scratch], scratch)
    wait_for_files([os.path.join(scratch, "ready.%d" % r) for r in range(2)])

    status = pxctl(d, "status").json
    assert status["pid"] == d.proc.pid
    assert status["cluster_state"] == "single" and status["node_count"] == 1
    assert status["workers"] == 2 and status["jobs"] == 1 and status["variables"] == 2
    assert status["stalls"] == 0 and status["timeline_path"] == ""
    assert status["socket"] == d.socket
    # Memory by part: the table's 100 x 4 f32 rows (SGD: no optimizer state), two workers'
    # arenas, no fabric on a single node; the same in the metrics.
    memory = status["memory"]
    assert memory["shards"] == 100 * 4 * 4, memory
    assert memory["arenas"] >= 2 * (1 << 20) and memory["fabric_buffers"] == 0, memory
    assert memory["resident"] > 4 * (1 << 20), memory
    # Each arena's head: two rings of 1,024 entries (80-byte submissions, 256-byte
    # completions) and a header; no device step stages anything.
    ring_bytes = 1024 * (80 + 256)
    assert 2 * ring_bytes <= memory["rings"] <= 2 * (ring_bytes + 4096), memory
    assert memory["staging"] == 0 and memory["caches"] == 0, memory
    m = d.metrics()
    assert metric(m, "parallax_memory_bytes", part="shards") == 100 * 4 * 4
    assert metric(m, "parallax_memory_bytes", part="arenas") == memory["arenas"]
    assert metric(m, "parallax_memory_bytes", part="rings") == memory["rings"]
    assert "memory" in pxctl(d, "status", json_output=False).stdout

    jobs = pxctl(d, "jobs").json["jobs"]
    assert len(jobs) == 1
    job = jobs[0]
    assert (job["name"], job["state"], job["local_size"], job["connected"]) == ("hold", "running", 2, 2)
    assert sorted(w["pid"] for w in job["workers"]) == sorted(workers.pids())
    assert [w["rank"] for w in job["workers"]] == [0, 1]

    variables = {v["name"]: v for v in pxctl(d, "vars").json["variables"]}
    assert set(variables) == {"grad", "emb"}
    assert variables["grad"]["kind"] == "dense" and variables["grad"]["ops"] == 1
    assert variables["grad"]["bytes"] == 16 * 4 * 2
    emb = variables["emb"]
    assert emb["kind"] == "sparse" and emb["route"] == "ps"  # hybrid: the router chose, ps
    assert (emb["pull_steps"], emb["push_steps"], emb["rows_pulled"], emb["rows_unique"]) == (1, 1, 20, 10)
    assert emb["alpha"] == pytest.approx(0.1)
    assert pxctl(d, "vars", "--job", "nosuch").json["variables"] == []

    peers = pxctl(d, "peers").json["peers"]
    assert peers == [{"index": 0, "address": "", "state": "self"}]
    assert pxctl(d, "stalls").json["stalls"] == []

    ckpt = os.path.join(scratch, "ckpt")
    done = pxctl(d, "checkpoint", ckpt).json
    assert done["ok"] and "checkpointed 1 sparse variables of 1 jobs" in done["message"]
    files = os.listdir(ckpt)
    assert any(f.endswith(".manifest") for f in files), files
    assert any(f.endswith(".shard") for f in files), files

    # The human-readable forms name the same things.
    text = pxctl(d, "jobs", json_output=False).stdout
    assert "hold" in text and "running" in text and "2/2" in text
    assert "emb" in pxctl(d, "vars", json_output=False).stdout
    assert "single node" in pxctl(d, "status", json_output=False).stdout

    open(os.path.join(scratch, "stop"), "w").close()
    workers.wait()
    drained = pxctl(d, "drain").json
    assert drained["ok"] and "it exited" in drained["message"]
    assert d.proc.wait(10) == 0
    assert "drain requested" in d.log()


def test_timeline_on_ops_off_gives_chrome_trace(daemons, scratch):
    d = daemons.start("timeline")
    trace = os.path.join(scratch, "trace.json")
    on = pxctl(d, "timeline", "on", trace).json
    assert on["ok"] and trace in on["message"]
    assert pxctl(d, "status").json["timeline_path"] == trace
    again = pxctl(d, "timeline", "on", trace, check=False)
    assert again.returncode == 1 and "already on" in again.stderr
    Workers([d], "tl", 2, ["dense", "3", "100"], scratch).wait()
    Workers([d], "tls", 2, ["sparse", "2", "100", "4", "10"], scratch).wait()
    off = pxctl(d, "timeline", "off").json
    assert off["ok"] and "events in " + trace in off["message"]
    with open(trace) as f:
        events = json.load(f)  # a complete JSON array
    names = {e["args"]["name"]: e["pid"] for e in events
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert "tl/grad" in names and "tls/emb" in names
    allreduces = [e for e in events if e["ph"] == "X" and e["name"] == "allreduce"]
    assert sorted(e["args"]["step"] for e in allreduces) == [0, 1, 2]
    assert all(e["pid"] == names["tl/grad"] and e["args"]["status"] == "PX_OK" for e in allreduces)
    for e in allreduces:  # its stages nest inside it
        inner = [s for s in events if s["ph"] == "X" and s["pid"] == e["pid"] and s["tid"] == e["tid"]
                 and s["name"] in ("wait_workers", "reduce_fan_out")
                 and e["ts"] - 0.001 <= s["ts"] <= e["ts"] + e["dur"] + 0.001]
        assert {s["name"] for s in inner} >= {"wait_workers", "reduce_fan_out"}
    pulls = [e for e in events if e["ph"] == "X" and e["name"] == "pull"]
    pushes = [e for e in events if e["ph"] == "X" and e["name"] == "push"]
    assert len(pulls) == 2 and len(pushes) == 2
    assert all(e["args"]["route"] == "ps" for e in pulls + pushes)
    assert any(e["name"] == "barrier" for e in events)
    off_again = pxctl(d, "timeline", "off", check=False)
    assert off_again.returncode == 1 and "off" in off_again.stderr


def test_stall_report_names_the_missing_worker(daemons, scratch):
    d = daemons.start("stall", ["--stall-report-ms", "300"])
    workers = Workers([d], "stall", 2, ["stall", scratch, "1"], scratch)
    wait_for_files([os.path.join(scratch, "ready.%d" % r) for r in range(2)])
    for _ in deadline_loop(20, "the stall report"):
        stalls = pxctl(d, "stalls").json["stalls"]
        if stalls and "stall: job 'stall'" in d.log():
            break
    s = stalls[0]
    assert (s["job"], s["variable"], s["operation"], s["step"], s["node"]) == ("stall", "stalled", "allreduce", 0, 0)
    assert s["kind"] == "workers" and s["arrived"] == [0] and s["waited_ms"] >= 300
    assert s["missing"] == [{"local_rank": 1, "rank": 1, "pid": workers.pids()[1], "connected": True}]
    assert "local rank 1 (global rank 1, pid %d)" % workers.pids()[1] in s["description"]
    assert pxctl(d, "status").json["stalls"] == 1
    assert metric(d.metrics(), "parallax_stalled_operations") == 1
    # The log line carries job, variable, step and node.
    line = [l for l in d.log().splitlines() if "stall: job 'stall'" in l][0]
    assert "variable 'stalled', allreduce step 0, node 0" in line
    assert pxctl(d, "stalls", "--min-ms", "3600000").json["stalls"] == []
    text = pxctl(d, "stalls", json_output=False).stdout
    assert "local rank 1" in text
    open(os.path.join(scratch, "stop"), "w").close()
    workers.wait()
    assert pxctl(d, "stalls").json["stalls"] == []


def test_stall_report_names_the_worker_whose_push_a_pull_waits_for(daemons, scratch):
    # One node: a pull waits for a local worker that pulled again before pushing, and the
    # report names that worker and the push step, never "the other nodes".
    d = daemons.start("pullstall", ["--stall-report-ms", "300"])
    workers = Workers([d], "pullstall", 2, ["pull-stall", scratch, "1"], scratch)
    wait_for_files([os.path.join(scratch, "ready.%d" % r) for r in range(2)])
    for _ in deadline_loop(20, "the stall report"):
        stalls = [s for s in pxctl(d, "stalls").json["stalls"] if s["operation"] == "pull"]
        if stalls:
            break
    s = stalls[0]
    assert (s["variable"], s["step"], s["kind"]) == ("emb", 1, "sent"), s
    assert "push step 0 has not come from local rank 1 (pushed no step)" in s["description"]
    assert "other nodes" not in s["description"]
    open(os.path.join(scratch, "stop"), "w").close()
    workers.wait()
    assert pxctl(d, "stalls").json["stalls"] == []


def test_two_node_cluster_metrics_peers_and_stalls(daemons, scratch):
    nodes = daemons.cluster(2, ["--stall-report-ms", "300"])
    for i, d in enumerate(nodes):
        s = d.status
        assert (s["cluster_state"], s["node_index"], s["node_count"], s["nodes_up"]) == ("ready", i, 2, 2)
        peers = pxctl(d, "peers").json["peers"]
        assert [p["state"] for p in peers] == (["self", "up"] if i == 0 else ["up", "self"])
        assert all(p["address"].startswith("127.0.0.1:") for p in peers)
    before = [d.metrics() for d in nodes]
    Workers(nodes, "cdense", 2, ["dense", "3", "1000"], scratch).wait()
    Workers(nodes, "csparse", 2, ["sparse", "2", "1000", "8", "50"], scratch).wait()
    after = [d.metrics() for d in nodes]
    for b, a in zip(before, after):
        assert delta(b, a, OPS, route="allreduce", operation="allreduce") == 3
        assert delta(b, a, BYTES, route="allreduce", operation="allreduce") == 3 * 1000 * 4 * 2
        assert delta(b, a, OPS, route="ps", operation="pull") == 2
        assert delta(b, a, OPS, route="ps", operation="push") == 2
        assert metric(a, "parallax_cluster_nodes_up") == 2
        # rxm's bounce buffers: a batch of 1,024 of 16 KiB each for receives and, after the
        # first send, one for sends.
        assert metric(a, "parallax_memory_bytes", part="fabric_buffers") == 2 * 1024 * 16384
        # Every operation here runs at priority 0: nothing overtakes (send_window.h).
        assert metric(a, "parallax_fabric_priority_overtakes_total") == 0
        assert delta(b, a, "parallax_step_latency_seconds_count", route="allreduce") == 3

    # A ring-sized allreduce (400 KB) takes scratch buffers; once its job has ended on every
    # node and no job is left, each daemon gives them back.
    Workers(nodes, "cring", 2, ["dense", "2", "100000"], scratch).wait()
    for _ in deadline_loop(20, "the scratch buffers released after the last job"):
        if all(pxctl(d, "status").json["memory"]["scratch"] == 0 for d in nodes):
            break

    # Global rank 3 (node 1, local rank 1) does not submit: node 1 names it; node 0, whose
    # workers all submitted, shows the step waiting across nodes.
    stall_dir = os.path.join(scratch, "stall")
    os.mkdir(stall_dir)
    workers = Workers(nodes, "cstall", 2, ["stall", stall_dir, "3"], scratch)
    wait_for_files([os.path.join(stall_dir, "ready.%d" % r) for r in range(4)])
    for _ in deadline_loop(20, "stall reports on both nodes"):
        on1 = pxctl(nodes[1], "stalls").json["stalls"]
        on0 = pxctl(nodes[0], "stalls").json["stalls"]
        if on1 and on0:
            break
    s = on1[0]
    assert (s["job"], s["variable"], s["operation"], s["step"], s["node"], s["kind"]) == (
        "cstall", "stalled", "allreduce", 0, 1, "workers")
    assert s["missing"] == [{"local_rank": 1, "rank": 3, "pid": workers.pids()[3], "connected": True}]
    assert s["node_label"].startswith("node 1 (127.0.0.1:")
    assert (on0[0]["node"], on0[0]["kind"], on0[0]["variable"]) == (0, "cross_node", "stalled")
    assert "waiting for the other nodes" in on0[0]["description"]
    open(os.path.join(stall_dir, "stop"), "w").close()
    workers.wait()


def test_pxctl_errors_are_clear(daemons, scratch):
    missing = pxctl(os.path.join(scratch, "nothing.sock"), "status", check=False)
    assert missing.returncode == 3 and "not running" in missing.stderr
    assert missing.json == {"ok": False, "error": missing.stderr.strip()[len("pxctl: "):]}
    usage = pxctl(scratch + "/x.sock", "frobnicate", check=False)
    assert usage.returncode == 2 and "unknown command" in usage.stderr

    d = daemons.start("errs", metrics=False)
    assert pxctl(d, "status").json["metrics_url"] == ""
    relative = pxctl(d, "timeline", "on", "", check=False)
    assert relative.returncode == 1 and "absolute" in relative.stderr

    # A daemon that does not answer (stopped): the deadline, not a hang.
    d.proc.send_signal(signal.SIGSTOP)
    try:
        start = time.monotonic()
        stuck = pxctl(d, "status", "--timeout", "0.5", check=False)
        assert stuck.returncode == 4 and "did not answer in time" in stuck.stderr
        assert time.monotonic() - start < 5
    finally:
        d.proc.send_signal(signal.SIGCONT)


def run_as_nobody():
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to run pxctl as another user")
    nobody = pwd.getpwnam("nobody")
    return ["setpriv", "--reuid=%d" % nobody.pw_uid, "--regid=%d" % nobody.pw_gid,
            "--clear-groups", "--"]


def test_pxctl_permission_denied_and_read_only_group_members(daemons, scratch):
    as_nobody = run_as_nobody()
    d = daemons.start("perm")
    refused = pxctl(d, "status", check=False, prefix=as_nobody)
    assert refused.returncode == 3 and "permission denied" in refused.stderr

    # Members of the daemon's group may read, not drain.
    group = subprocess.run(["id", "-gn", "nobody"], capture_output=True, text=True).stdout.strip()
    g = daemons.start("group", ["--group", group])
    assert pxctl(g, "status", prefix=as_nobody).json["pid"] == g.proc.pid
    drain = pxctl(g, "drain", check=False, prefix=as_nobody)
    assert drain.returncode == 1 and "needs parallaxd's own user" in drain.stderr
    assert g.proc.poll() is None


def test_metrics_config_errors_stop_the_daemon(scratch):
    bad = subprocess.run([os.environ["PARALLAXD"], "--foreground", "--socket", scratch + "/b.sock",
                          "--metrics-listen", "nowhere"], capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "metrics.listen" in bad.stderr
    import socket as sockets
    taken = sockets.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        busy = subprocess.run([os.environ["PARALLAXD"], "--foreground", "--socket",
                               scratch + "/c.sock", "--metrics-listen", "127.0.0.1:%d" % port],
                              capture_output=True, text=True, timeout=30)
        assert busy.returncode == 1 and "metrics.listen 127.0.0.1:%d" % port in busy.stderr
    finally:
        taken.close()


PROBE = r"""
import json, os, subprocess, sys, urllib.request
from prometheus_client.parser import text_string_to_metric_families
subprocess.run([os.environ["OBSERVE_WORKER"], "dense", "3", "100"], check=True)
if os.environ["PARALLAX_LOCAL_RANK"] == "0":
    status = json.loads(subprocess.run([os.environ["PXCTL"], "--json", "status"], check=True,
                                       capture_output=True, text=True).stdout)
    text = urllib.request.urlopen(status["metrics_url"], timeout=10).read().decode()
    ops = [s.value for f in text_string_to_metric_families(text) for s in f.samples
           if s.name == "parallax_operations_total" and s.labels.get("operation") == "allreduce"]
    # One write of the whole line: the two nodes' probes share px-cluster's stdout.
    os.write(1, ("PROBE " + json.dumps({"node": status["node_index"],
                                        "state": status["cluster_state"],
                                        "up": status["nodes_up"], "allreduces": ops}) +
                 "\n").encode())
"""


def test_two_node_cluster_under_px_cluster():
    """px-cluster starts the daemons (metrics on, port 0 each) and the workers; each node's
    local rank 0 asks its daemon through pxctl (PARALLAX_SOCKET) and scrapes it."""
    px_cluster = os.environ["PX_CLUSTER"]
    run = subprocess.run([px_cluster, "--nodes", "2", "--workers-per-node", "2", "--daemon",
                          os.environ["PARALLAXD"], "--daemon-arg", "--metrics-listen",
                          "--daemon-arg", "127.0.0.1:0", "--timeout", "120", "--",
                          "/usr/bin/python3", "-c", PROBE],
                         capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stdout + run.stderr
    # Found anywhere in the output: a line of the other node's may still run into one.
    probes = sorted((json.loads(m) for m in re.findall(r"PROBE (\{[^{}]*\})", run.stdout)),
                    key=lambda p: p["node"])
    assert probes == [{"node": n, "state": "ready", "up": 2, "allreduces": [3.0]} for n in (0, 1)]
