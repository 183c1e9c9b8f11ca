"""Fixtures that start real parallaxd daemons and real worker processes.

Environment (set by ctest; see clients/python/CMakeLists.txt): PARALLAXD (the daemon),
PARALLAX_LIB (libparallax.so.1), PX_CLUSTER (tools/px-cluster).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_ROOT = os.path.dirname(HERE)
WORKER = os.path.join(HERE, "pyworker.py")
PYTHON = sys.executable


def _require(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.exit(f"{name} is not set: run these tests through ctest (or set it)", 2)
    return value


class Daemon:
    """One parallaxd on its own socket, in the foreground, stopped at the end with SIGTERM:
    it must exit with 0 (a crash or a hang on the way out fails the test), unless the test
    SIGKILLed it itself."""

    def __init__(self, *args: str, wait: bool = True):
        """wait: until its socket exists (False: a daemon that waits for something first,
        such as a spare for a node index; wait_started() then)."""
        self.dir = tempfile.mkdtemp(prefix="pxpy-")
        self.socket = os.path.join(self.dir, "parallaxd.sock")
        # Appending: the daemon shares the file's offset, which log_text() moves to read.
        self.log = open(os.path.join(self.dir, "parallaxd.log"), "a+")
        # PX_TEST_LOG_LEVEL and PX_KEEP_LOGS: docs/building.md.
        level = os.environ.get("PX_TEST_LOG_LEVEL", "warn")
        self.proc = subprocess.Popen([_require("PARALLAXD"), "--foreground", "--socket",
                                      self.socket, "--log-level", level, *args],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        if wait:
            self.wait_started(20)

    def wait_started(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not os.path.exists(self.socket):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"parallaxd did not start: {self.log_text()}")
            time.sleep(0.02)

    def log_text(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def env(self, job: str = None) -> dict:
        env = dict(os.environ)
        env["PARALLAX_SOCKET"] = self.socket
        env["PARALLAX_JOB"] = job or f"job-{uuid.uuid4().hex[:8]}"
        env["PYTHONPATH"] = PACKAGE_ROOT + os.pathsep + env.get("PYTHONPATH", "")
        return env

    def stop(self) -> None:
        killed_by_test = self.proc.poll() == -signal.SIGKILL
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            code = self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            code = "none: still running 10 s after SIGTERM, killed"
        text = self.log_text()
        self.log.close()
        if not os.environ.get("PX_KEEP_LOGS"):
            shutil.rmtree(self.dir, ignore_errors=True)
        if code != 0 and not killed_by_test:
            raise AssertionError(f"parallaxd did not exit cleanly ({code}); its log:\n{text[-4000:]}")


@pytest.fixture
def daemon():
    d = Daemon()
    yield d
    d.stop()


def run_workers(daemon: Daemon, scenario: str, n: int, *args: str, timeout: float = 120,
                extra_env: dict = None, expect_ok: bool = True, worker: str = "pyworker.py",
                job: str = None) -> list:
    """Runs n worker processes of one job on the daemon; returns each one's JSON result
    (its last stdout line) in local-rank order."""
    env = daemon.env(job)
    env.update(extra_env or {})
    procs = []
    for r in range(n):
        e = dict(env, PARALLAX_LOCAL_RANK=str(r), PARALLAX_LOCAL_SIZE=str(n))
        procs.append(subprocess.Popen([PYTHON, os.path.join(HERE, worker), scenario, *args], env=e,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    results = []
    for r, p in enumerate(procs):
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError(f"worker {r} of '{scenario}' did not finish in {timeout} s")
        if expect_ok and p.returncode != 0:
            raise AssertionError(f"worker {r} of '{scenario}' exited {p.returncode}:\n{err}"
                                 f"\ndaemon log:\n{daemon.log_text()}")
        lines = [l for l in out.splitlines() if l.strip()]
        results.append({"rc": p.returncode, "stderr": err,
                        **(json.loads(lines[-1]) if lines else {})})
    return results


def run_cluster(nodes: int, per_node: int, scenario: str, *args: str, timeout: int = 180,
                extra_env: dict = None, worker: str = "pyworker.py",
                daemon_args: tuple = ()) -> list:
    """Runs the scenario on a px-cluster of real daemons over libfabric (loopback); every
    worker writes its JSON result to a file; returns them ordered by global rank."""
    out_dir = tempfile.mkdtemp(prefix="pxpy-cluster-")
    env = dict(os.environ)
    env["PYTHONPATH"] = PACKAGE_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["PXPY_RESULT_DIR"] = out_dir
    env.update(extra_env or {})
    cmd = [_require("PX_CLUSTER"), "--nodes", str(nodes), "--workers-per-node", str(per_node),
           "--daemon", _require("PARALLAXD"), *(a for arg in daemon_args
                                                for a in ("--daemon-arg", arg)),
           "--timeout", str(timeout), "--job",
           f"py-{uuid.uuid4().hex[:8]}", "--", PYTHON, os.path.join(HERE, worker), scenario, *args]
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout + 30)
        assert p.returncode == 0, f"px-cluster exited {p.returncode}:\n{p.stdout}\n{p.stderr}"
        results = []
        for name in os.listdir(out_dir):
            with open(os.path.join(out_dir, name)) as f:
                results.append(json.load(f))
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    results.sort(key=lambda r: r["rank"])
    assert len(results) == nodes * per_node, p.stderr
    return results


def run_script_workers(script: str, daemon: Daemon, scenario: str, n: int, *args: str,
                       timeout: float = 120) -> list:
    """run_workers for another worker script (same protocol: SCENARIO ARGS, JSON last line)."""
    return run_workers(daemon, scenario, n, *args, timeout=timeout, worker=script)


def run_script_cluster(script: str, nodes: int, per_node: int, scenario: str, *args: str,
                       timeout: int = 180) -> list:
    """run_cluster for another worker script (results in $PXPY_RESULT_DIR/<rank>.json)."""
    return run_cluster(nodes, per_node, scenario, *args, timeout=timeout, worker=script)
