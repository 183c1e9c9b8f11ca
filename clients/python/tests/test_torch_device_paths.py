"""The code parallax.torch's CUDA path shares with the host path, run here on host tensors
(no GPU): tensors over Parallax memory through DLPack (Client.empty_tensor, the buckets),
buckets per (device, dtype), broadcast buffers placed by device, the sparse layers' staging
in px_alloc_ex-style memory, TrainPipeline(device=), the refusals of other devices, and the
package without NumPy. One worker, in this process, against a real daemon.
"""

from __future__ import annotations

import collections
import gc
import os
import subprocess
import uuid

import pytest
import torch
from torch import nn

import parallax
import parallax._dlpack as dlpack
import parallax.torch as pxt
from parallax.torch import ddp, pipeline, sparse

from conftest import PACKAGE_ROOT, PYTHON

torch.set_num_threads(1)


@pytest.fixture
def px(daemon):
    c = parallax.Client(daemon.socket, f"dev-{uuid.uuid4().hex[:8]}", local_rank=0,
                        local_size=1, timeout=20, op_timeout=20)
    yield c
    c.close()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16,
                                   torch.bfloat16, torch.int32, torch.int64, torch.uint8,
                                   torch.bool])
def test_empty_tensor_is_a_dlpack_view_of_the_arena(px, dtype):
    t = px.empty_tensor((3, 5), dtype)
    assert t.dtype == dtype and t.shape == (3, 5) and t.is_contiguous()
    assert t.device.type == "cpu" and not t.requires_grad
    t.zero_()
    assert int(t.sum()) == 0


def test_empty_tensor_memory_lives_as_long_as_a_view(px):
    before = len(dlpack._live)
    t = px.empty_tensor(1000)
    view = t[10:20].view(2, 5)
    address = t.data_ptr()
    del t
    gc.collect()
    assert len(dlpack._live) == before + 1  # the view holds the block
    view.fill_(3.0)
    assert view.data_ptr() == address + 40
    del view
    gc.collect()
    assert len(dlpack._live) == before


def test_allreduce_in_place_on_an_empty_tensor(px):
    x = px.empty_tensor(6, torch.float64)
    x.copy_(torch.arange(6, dtype=torch.float64))
    got = px.dense("dev.sum", 6, torch.float64).allreduce(x).wait()
    assert got is x and torch.equal(x, torch.arange(6, dtype=torch.float64))


def test_empty_tensor_refuses_other_devices(px):
    with pytest.raises(parallax.InvalidArgument, match="device meta"):
        px.empty_tensor(4, device="meta")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_cuda_memory_without_a_gpu_is_refused_by_the_library(px):
    with pytest.raises(parallax.ParallaxError, match="PX_MEMORY_CUDA"):
        px.empty_tensor(4, torch.float32, "cuda:0")


def test_other_devices_are_refused_naming_the_tensor(px):
    meta = torch.zeros(3, dtype=torch.int64, device="meta")
    with pytest.raises(parallax.InvalidArgument, match="pull indices of 'dev.t'.*meta"):
        px.sparse("dev.t", 10, 2).pull(meta)
    emb = pxt.Embedding(10, 2, name="dev.emb", client=px)
    with pytest.raises(parallax.InvalidArgument, match="'dev.emb'.*meta"):
        emb(meta)
    model = nn.Linear(2, 2).to("meta")
    with pytest.raises(parallax.InvalidArgument, match="'weight' is on meta"):
        pxt.broadcast_parameters(model.state_dict(), client=px)
    with pytest.raises(parallax.InvalidArgument, match="parameter 'weight' is on meta"):
        pxt.DistributedDataParallel(model, client=px, init_sync=False)
    with pytest.raises(parallax.InvalidArgument, match="allreduce input of 'dev.sum' is a meta"):
        px.dense("dev.sum", 3, torch.int64).allreduce(meta)


def test_buckets_are_per_device_and_dtype():
    cpu32 = [torch.zeros(4) for _ in range(3)]
    meta32 = torch.zeros(4, device="meta")
    cpu64 = torch.zeros(4, dtype=torch.float64)
    named = [("a", cpu32[0]), ("m", meta32), ("b", cpu32[1]), ("d", cpu64), ("c", cpu32[2])]
    buckets = ddp._assign_buckets(named, 1 << 20, 1 << 20)
    got = [(str(b.device), b.dtype, [s.name for s in b.slots]) for b in buckets]
    assert got == [("cpu", torch.float32, ["c", "b", "a"]),  # in the order first opened
                   ("cpu", torch.float64, ["d"]),
                   ("meta", torch.float32, ["m"])]


def test_broadcast_buffer_goes_where_the_first_cuda_tensor_is():
    assert ddp._buffer_device([torch.zeros(1), torch.zeros(2)]) == torch.device("cpu")
    assert ddp._buffer_device([torch.zeros(1), torch.zeros(1, device="meta")]) == \
        torch.device("cpu")  # only CUDA memory is taken besides the host's


def test_broadcast_of_mixed_dtypes_and_scalars(px):
    opt = torch.optim.Adam([nn.Parameter(torch.ones(3))], lr=0.5)
    opt.param_groups[0]["params"][0].grad = torch.ones(3)
    opt.step()
    before = {k: v.clone() if isinstance(v, torch.Tensor) else v
              for k, v in opt.state[opt.param_groups[0]["params"][0]].items()}
    pxt.broadcast_optimizer_state(opt, client=px)
    state = opt.state[opt.param_groups[0]["params"][0]]
    assert all(torch.equal(state[k], v) if isinstance(v, torch.Tensor) else state[k] == v
               for k, v in before.items())
    pxt.broadcast_parameters({"i": torch.arange(3), "b": torch.tensor([True, False]),
                              "h": torch.ones(2, dtype=torch.float16)}, client=px)


def test_sparse_layer_through_the_staging_memory(px, monkeypatch):
    """The device path's staging (indices and rows copied into Parallax memory, kept and
    grown; rows copied out as the leaf; gradients copied in) taken on host memory: the
    table trains as torch's Adagrad on an nn.Embedding, and the staging is reused."""
    monkeypatch.setattr(sparse._Table, "_staged", lambda self, unique: self.device_steps)
    rows, dim = 3000, 4
    torch.manual_seed(0)
    w0 = torch.randn(rows, dim)
    emb = pxt.Embedding(rows, dim, name="dev.staged", client=px, optimizer="adagrad", lr=0.3,
                        initial_accumulator=0.1, epsilon=1e-10)
    emb.load_state_dict({"weight": w0})
    ref = nn.Embedding(rows, dim)
    ref.weight.data.copy_(w0)
    opt = torch.optim.Adagrad(ref.parameters(), lr=0.3, initial_accumulator_value=0.1,
                              eps=1e-10)
    target = torch.linspace(-1, 1, dim)
    g = torch.Generator().manual_seed(7)
    capacities = []
    for n in (10, 600, 1500, 20):  # the third outgrows 1024 staged rows
        idx = torch.randint(0, rows, (n,), generator=g)
        ((emb(idx) - target) ** 2).mean().backward()
        opt.zero_grad()
        ((ref(idx) - target) ** 2).mean().backward()
        opt.step()
        capacities.append({k: v[0].numel() for k, v in emb._table._stages.items()})
    assert capacities[0] == {("pull", torch.device("cpu")): 1024,
                             ("push", torch.device("cpu")): 1024}
    assert capacities[2][("pull", torch.device("cpu"))] == 2048 == capacities[3][
        ("pull", torch.device("cpu"))]
    emb.eval()
    with torch.no_grad():
        read = emb(torch.arange(50))
    emb.synchronize()
    got = emb.state_dict()["weight"]
    assert ((got - ref.weight.data).abs() / ref.weight.data.abs().clamp_min(1e-3)).max() < 1e-5
    assert torch.allclose(read, ref.weight.data[:50], rtol=1e-5, atol=1e-6)


def test_prefetch_tables_do_not_stage():
    table = sparse._Table.__new__(sparse._Table)
    table.device_steps = False
    assert not table._staged(torch.zeros(1, dtype=torch.int64))


def test_pipeline_moves_batches_to_the_device():
    Pair = collections.namedtuple("Pair", "x y")
    batch = {"a": (torch.ones(2), [torch.zeros(1), 3]), "p": Pair(torch.ones(1), "s")}
    moved = pipeline._to_device(batch, torch.device("cpu"))
    assert isinstance(moved["p"], Pair) and moved["p"].y == "s"
    assert isinstance(moved["a"], tuple) and isinstance(moved["a"][1], list)
    assert moved["a"][1][1] == 3 and torch.equal(moved["a"][0], torch.ones(2))
    assert pipeline._to_device(batch, None) is batch


def test_train_pipeline_device_argument(px):
    emb = pxt.Embedding(20, 3, name="dev.pipe", client=px, optimizer="sgd", lr=0.1,
                        prefetch=True)
    seen = []

    def forward(model, batch):
        seen.append(batch.device)
        return model(batch).sum()

    p = pxt.TrainPipeline(emb, [], forward=forward, device="cpu")
    assert p.device == torch.device("cpu")
    it = iter([torch.tensor([1, 2]), torch.tensor([2, 3])])
    p.progress(it)
    p.progress(it)
    with pytest.raises(StopIteration):
        p.progress(it)
    assert seen == [torch.device("cpu")] * 2 and p.steps == 2


NO_NUMPY = r"""
import sys
sys.modules["numpy"] = None            # as where NumPy is not installed
import torch, parallax
px = parallax.Client(sys.argv[1], sys.argv[2], local_rank=0, local_size=1)
try:
    px.empty(4)
    raise SystemExit("empty() without NumPy did not raise")
except parallax.InvalidArgument as e:
    assert "NumPy" in str(e), e
t = px.empty_tensor(4)
t.fill_(1.5)
assert px.dense("nonp.d", 4).allreduce(t).wait() is t
s = px.sparse("nonp.s", 10, 2)
rows = s.pull([1, 2, 2]).wait()          # a list of indices, through torch
assert isinstance(rows, torch.Tensor) and rows.shape == (3, 2), rows
s.push(torch.tensor([1]), torch.ones(1, 2)).wait()
out = px.dense("nonp.g", 2, torch.int64).allgather(torch.tensor([4, 5])).wait()
assert out.tolist() == [4, 5], out
assert sys.modules["numpy"] is None
px.close()
print("ok")
"""


def test_the_package_works_without_numpy(daemon):
    env = dict(os.environ)
    env["PYTHONPATH"] = PACKAGE_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.run([PYTHON, "-c", NO_NUMPY, daemon.socket, f"nonp-{uuid.uuid4().hex[:6]}"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stderr[-3000:]
