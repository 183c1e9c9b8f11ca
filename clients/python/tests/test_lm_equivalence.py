"""The equivalence test: the language model trained on 2 nodes x 2 workers through Parallax
reaches the same loss after 20 steps as one plain-PyTorch process given the same global
batch and the same initialisation: written with parallax.torch's layers, and as the plain
model handed to parallax.torch.parallelize().

Tolerance 1e-4 relative: both runs do the same float32 arithmetic in a different order
(each worker's gradient is a quarter of the batch, averaged by the daemons; the reference
sums the whole batch at once), so they differ by rounding, ~1e-7 relative per operation,
which training may amplify. Measured: every step's loss within 1.2e-7, parameter sums
within 4e-8; 1e-4 is a wide margin and still far below what a real error does (one
worker's gradient lost, a row applied twice, a mean taken as a sum, an optimizer off by a
step).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import uuid

from conftest import PACKAGE_ROOT, _require

TRAIN = os.path.join(os.path.dirname(PACKAGE_ROOT), "..", "tools", "lm", "train.py")
STEPS = 20
ARGS = ["--steps", str(STEPS), "--batch", "8", "--bptt", "16", "--hidden", "64",
        "--sampled", "128", "--eval-tokens", "1024", "--log-every", "5"]


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = PACKAGE_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


def test_2x2_cluster_matches_one_process_on_the_global_batch():
    _matches_reference([])


def test_2x2_cluster_with_prefetch_matches_one_process():
    # Each step's rows of both tables pulled during the previous step's backward
    # (px_prefetch_rows): exact in sync mode, so the same comparison holds.
    _matches_reference(["--prefetch"])


def test_2x2_cluster_parallelizing_the_reference_model_matches_one_process():
    # train.py --parallelize: ReferenceLM and its optimizers (Adam on the body, Adagrad on
    # both nn.Embedding tables) as they are, through pxt.parallelize(); the output table is
    # looked up twice a step (targets and the sample).
    _matches_reference(["--parallelize"], tables=("lm.embedding", "lm.softmax_table"))


def _matches_reference(extra, tables=("lm.embedding", "lm.softmax")):
    with tempfile.TemporaryDirectory(prefix="pxpy-lm-") as work:
        _run_and_compare(work, extra, tables)


def _run_and_compare(work, extra, tables):
    ref_json, px_json = os.path.join(work, "ref.json"), os.path.join(work, "px.json")
    ref = subprocess.run([sys.executable, TRAIN, "--reference", "4", "--json", ref_json, *ARGS],
                         env=_env(), capture_output=True, text=True, timeout=300)
    assert ref.returncode == 0, ref.stderr
    run = subprocess.run([_require("PX_CLUSTER"), "--nodes", "2", "--workers-per-node", "2",
                          "--daemon", _require("PARALLAXD"), "--timeout", "300", "--job",
                          f"lm-{uuid.uuid4().hex[:6]}", "--", sys.executable, TRAIN,
                          "--json", px_json, *ARGS, *extra],
                         env=_env(), capture_output=True, text=True, timeout=400)
    assert run.returncode == 0, run.stdout + run.stderr
    with open(ref_json) as f:
        expected = json.load(f)
    with open(px_json) as f:
        got = json.load(f)
    assert len(got["losses"]) == STEPS
    for step in (0, STEPS - 1):
        e, g = expected["losses"][step], got["losses"][step]
        assert abs(g - e) <= 1e-4 * abs(e), (step, g, e)
    # The loss must have moved, or the comparison says nothing.
    assert got["losses"][-1] < got["losses"][0] - 0.1, got["losses"]
    for key in ("embedding_sum", "softmax_sum", "body_sum"):
        e, g = expected[key], got[key]
        assert abs(g - e) <= 1e-4 * max(1.0, abs(e)), (key, g, e)
    # The demo's report: perplexity and a route line per table per node.
    assert "held-out perplexity" in run.stdout
    for node in (0, 1):
        for table in tables:
            assert f"node {node}  {table}" in run.stdout, run.stdout
