"""Real parallaxd daemons, observe_worker processes and pxctl for test_observe.py.

Paths come from the environment ctest sets (tests/observe/CMakeLists.txt): PARALLAXD, PXCTL,
OBSERVE_WORKER, PX_TEST_WORKER. Every daemon gets its own socket, log and metrics port
(port 0: the kernel picks; pxctl status tells which)."""
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

PARALLAXD = os.environ.get("PARALLAXD", "")
PXCTL = os.environ.get("PXCTL", "")
WORKER = os.environ.get("OBSERVE_WORKER", "")
TEST_WORKER = os.environ.get("PX_TEST_WORKER", "")


def deadline_loop(seconds, what):
    """Yields until seconds pass, then fails naming what was waited for."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        yield
        time.sleep(0.02)
    raise AssertionError("timed out after %s s waiting for %s" % (seconds, what))


class Daemon:
    def __init__(self, scratch, name, args=(), metrics=True):
        self.socket = os.path.join(scratch, name + ".sock")
        self.log_path = os.path.join(scratch, name + ".log")
        argv = [PARALLAXD, "--foreground", "--socket", self.socket, "--threads", "2"]
        if metrics:
            argv += ["--metrics-listen", "127.0.0.1:0"]
        argv += list(args)
        self.log_file = open(self.log_path, "w")
        self.proc = subprocess.Popen(argv, stdout=self.log_file, stderr=subprocess.STDOUT)

    def wait_ready(self):
        for _ in deadline_loop(30, "parallaxd on " + self.socket):
            if self.proc.poll() is not None:
                raise AssertionError("parallaxd exited %s: %s" % (self.proc.returncode, self.log()))
            r = pxctl(self, "status", check=False)
            if r.returncode == 0 and r.json["cluster_state"] in ("single", "ready"):
                self.status = r.json
                return self

    def log(self):
        with open(self.log_path) as f:
            return f.read()

    def metrics(self):
        url = self.status["metrics_url"]
        with urllib.request.urlopen(url, timeout=10) as response:
            return parse_metrics(response.read().decode())

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log_file.close()


class PxctlResult:
    def __init__(self, proc):
        self.returncode = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        try:
            self.json = json.loads(proc.stdout) if proc.stdout.strip() else None
        except ValueError:
            self.json = None


def pxctl(daemon_or_socket, *args, check=True, json_output=True, timeout=60, prefix=()):
    socket_path = getattr(daemon_or_socket, "socket", daemon_or_socket)
    argv = list(prefix) + [PXCTL, "--socket", socket_path] + (["--json"] if json_output else [])
    proc = subprocess.run(argv + list(args), capture_output=True, text=True, timeout=timeout)
    result = PxctlResult(proc)
    if check and proc.returncode != 0:
        raise AssertionError("pxctl %s exited %d: %s %s" % (" ".join(args), proc.returncode,
                                                          proc.stdout, proc.stderr))
    return result


def parse_metrics(text):
    """{(sample name, frozenset of labels): value} with Debian's prometheus_client parser."""
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return samples


def metric(samples, name, **labels):
    return samples.get((name, frozenset(labels.items())), 0.0)


class Workers:
    """local_size workers of job on each daemon given (node-major ranks)."""

    def __init__(self, daemons, job, local_size, args, scratch, program=None):
        self.procs = []
        self.outputs = []
        for n, daemon in enumerate(daemons):
            for rank in range(local_size):
                env = dict(os.environ, PARALLAX_SOCKET=daemon.socket, PARALLAX_JOB=job,
                           PARALLAX_LOCAL_RANK=str(rank), PARALLAX_LOCAL_SIZE=str(local_size))
                out = open(os.path.join(scratch, "%s-n%dw%d.out" % (job, n, rank)), "w+")
                self.outputs.append(out)
                self.procs.append(subprocess.Popen([program or WORKER] + list(args), env=env,
                                                   stdout=out, stderr=subprocess.STDOUT))

    def pids(self):
        return [p.pid for p in self.procs]

    def wait(self, timeout=120):
        end = time.monotonic() + timeout
        codes = []
        for p in self.procs:
            try:
                codes.append(p.wait(max(0.1, end - time.monotonic())))
            except subprocess.TimeoutExpired:
                p.kill()
                codes.append(p.wait())
        texts = []
        for out in self.outputs:
            out.seek(0)
            texts.append(out.read())
            out.close()
        assert codes == [0] * len(codes), "workers exited %s:\n%s" % (codes, "\n".join(texts))
        return texts


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


@pytest.fixture
def scratch():
    path = tempfile.mkdtemp(prefix="px-observe-")
    os.chmod(path, 0o755)  # other users (the permission tests) must reach the socket
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def daemons(scratch):
    """Starts daemons (start(name, args) or cluster(n, args)); stops them at the end."""
    started = []

    class Factory:
        def start(self, name, args=(), metrics=True):
            d = Daemon(scratch, name, args, metrics)
            started.append(d)
            return d.wait_ready()

        def cluster(self, n, args=()):
            ports = free_ports(n)
            nodes = ",".join("127.0.0.1:%d" % p for p in ports)
            ds = []
            for i in range(n):
                d = Daemon(scratch, "node%d" % i,
                           ["--cluster", "obs%d" % os.getpid(), "--node-index", str(i), "--nodes",
                            nodes, "--fabric-provider", "tcp;ofi_rxm", "--startup-timeout-ms",
                            "20000"] + list(args))
                started.append(d)
                ds.append(d)
            return [d.wait_ready() for d in ds]

    yield Factory()
    for d in started:
        d.stop()
