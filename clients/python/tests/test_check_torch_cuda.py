"""tests/gpu/check_torch_cuda.py, the GPU kit's check of parallax.torch on CUDA tensors, run
here: its checks on host tensors (--device cpu) must pass against their single-process
references, with NumPy and as where NumPy is not installed; without a CUDA device (this
machine) the default run must skip every check, say why, and exit 77.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import tempfile

import pytest
import torch

from conftest import HERE, PACKAGE_ROOT, PYTHON, _require

CHECK = os.path.join(HERE, "gpu", "check_torch_cuda.py")
# Every test's output under one scratch folder, removed when the tests end.
SCRATCH = tempfile.mkdtemp(prefix="pxcheck-test-")
atexit.register(shutil.rmtree, SCRATCH, True)

NAMES = ["ddp-1x2", "ddp-2x1", "optimizer-1x2", "broadcast", "embedding", "pipeline",
         "softmax-bag"]


def run_check(*args: str, extra_env: dict = None, timeout: float = 400):
    _require("PARALLAXD")
    _require("PX_CLUSTER")
    out = os.path.join(tempfile.mkdtemp(dir=SCRATCH), "RESULT.json")
    env = dict(os.environ)
    env["PYTHONPATH"] = PACKAGE_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra_env or {})
    logs = os.path.join(os.path.dirname(out), "logs")  # a failed check's, kept in SCRATCH
    p = subprocess.run([PYTHON, CHECK, "--out", out, "--logs", logs, *args], env=env,
                       capture_output=True, text=True, timeout=timeout)
    with open(out) as f:
        return p, json.load(f)


def failures(result: dict) -> str:
    return json.dumps([c for c in result["checks"] if c["status"] != "passed"],
                      indent=1)[-6000:]


def test_every_check_passes_on_host_tensors():
    # A budget for this machine, whose two cores other builds and tests may share.
    p, result = run_check("--device", "cpu", "--budget", "300")
    assert p.returncode == 0, f"{p.stderr[-3000:]}\n{failures(result)}"
    assert [c["name"] for c in result["checks"]] == NAMES
    assert result["mode"] == "cpu" and result["torch"] == torch.__version__
    for c in result["checks"]:
        assert c["status"] == "passed" and c["seconds"] > 0, c
        workers = c["detail"]["workers"]
        assert len(workers) == 2 and all(w["ok"] for w in workers), c
        if c["name"] in ("ddp-1x2", "ddp-2x1", "optimizer-1x2"):
            for w in workers:  # within 1e-5 relative, and training moved the weights
                assert w["worst_over_tolerance"] <= 1 and w["moved"] > 0.01, w
                assert w["grads_are_bucket_views"] and w["bucket_devices"] == ["cpu"], w
    nodes = {c["name"]: (c["detail"]["nodes"], c["detail"]["workers_per_node"])
             for c in result["checks"]}
    assert nodes["ddp-1x2"] == (1, 2) and nodes["ddp-2x1"] == (2, 1)
    broadcast = next(c for c in result["checks"] if c["name"] == "broadcast")
    assert [w["differed_before"] for w in broadcast["detail"]["workers"]] == [False, True]


def test_checks_run_without_numpy():
    """The torch path of the package needs no NumPy (pip's torch 2.x comes without it)."""
    only = ["ddp-1x2", "broadcast", "embedding", "pipeline"]
    p, result = run_check("--device", "cpu", "--budget", "200",
                          *(a for n in only for a in ("--only", n)),
                          extra_env={"PX_CHECK_HIDE_NUMPY": "1"})
    assert p.returncode == 0, f"{p.stderr[-3000:]}\n{failures(result)}"
    assert [c["name"] for c in result["checks"]] == only
    for c in result["checks"]:
        assert all(not w["numpy_loaded"] for w in c["detail"]["workers"]), c


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_without_a_cuda_device_every_check_is_skipped_with_exit_77():
    p, result = run_check(timeout=60)
    assert p.returncode == 77, p.stderr
    assert [c["name"] for c in result["checks"]] == NAMES
    for c in result["checks"]:
        assert c["status"] == "skipped", c
        assert isinstance(c["detail"], str) and ("CUDA" in c["detail"]), c
    assert result["mode"] == "cuda" and result["torch"] == torch.__version__
    assert "skipped" in p.stderr and "CUDA" in p.stderr


def test_a_spent_budget_fails_the_checks_left():
    p, result = run_check("--device", "cpu", "--budget", "10", "--only", "broadcast",
                          timeout=60)
    assert p.returncode == 1
    (check,) = result["checks"]
    assert check["status"] == "failed" and "budget of 10 s" in check["detail"], check


def test_missing_environment_fails_clearly():
    env = {k: v for k, v in os.environ.items() if k not in ("PARALLAXD",)}
    out = os.path.join(tempfile.mkdtemp(dir=SCRATCH), "RESULT.json")
    p = subprocess.run([PYTHON, CHECK, "--device", "cpu", "--only", "broadcast", "--out", out],
                       env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 1
    with open(out) as f:
        (check,) = json.load(f)["checks"]
    assert check["status"] == "failed" and "PARALLAXD" in check["detail"]
