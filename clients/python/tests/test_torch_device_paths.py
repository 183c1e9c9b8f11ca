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


class FakeCuda(torch.Tensor):
    """A host tensor that says it is on cuda:0: what reaches the C ABI from CUDA tensors
    can be seen here (the C calls are replaced; nothing reads the memory)."""

    @property
    def device(self):
        return torch.device("cuda", 0)

    def __getitem__(self, key):  # slices stay FakeCuda in autograd hooks too, where
        # torch functions do not re-wrap subclasses
        return torch.Tensor.__getitem__(self, key).as_subclass(FakeCuda)


def test_cuda_tensors_reach_the_c_abi_as_device_operations(px, monkeypatch):
    from types import SimpleNamespace

    from parallax import _lib
    calls = []

    def fake(name):
        def call(*args):
            opts = args[-2]._obj  # byref(px_op_options)
            calls.append((name, opts.memory_kind, opts.device, opts.stream, opts.priority))
            return _lib.ERR_NOT_IMPLEMENTED
        return call

    for name in ("px_pull_rows_ex", "px_push_rows_ex", "px_read_rows_ex", "px_allreduce_ex",
                 "px_broadcast_ex"):
        monkeypatch.setattr(_lib.lib, name, fake(name))
    monkeypatch.setattr(torch.cuda, "current_stream",
                        lambda device=None: SimpleNamespace(cuda_stream=0xabc0))
    table = px.sparse("dev.fake", 10, 2)
    idx = torch.arange(3).as_subclass(FakeCuda)
    rows = torch.zeros(3, 2).as_subclass(FakeCuda)
    for op in (lambda: table.pull(idx, rows, priority=7), lambda: table.push(idx, rows),
               lambda: table.read(idx, rows)):
        with pytest.raises(parallax.NotImplementedInParallax):
            op()
    x = torch.ones(4).as_subclass(FakeCuda)
    dense = px.dense("dev.fake.d", 4)
    for op in (lambda: dense.allreduce(x), lambda: dense.broadcast(x, root=0)):
        with pytest.raises(parallax.NotImplementedInParallax):
            op()
    cuda = (_lib.MEMORY_CUDA, 0, 0xabc0)
    assert calls == [("px_pull_rows_ex", *cuda, 7), ("px_push_rows_ex", *cuda, 0),
                     ("px_read_rows_ex", *cuda, 0), ("px_allreduce_ex", *cuda, 0),
                     ("px_broadcast_ex", *cuda, 0)]
    with pytest.raises(parallax.InvalidArgument, match="indices on cuda:0, rows on cpu"):
        table.pull(idx, torch.zeros(3, 2))
    with pytest.raises(parallax.InvalidArgument, match="must be contiguous int64"):
        table.pull(torch.arange(3, dtype=torch.int32).as_subclass(FakeCuda), rows)
    with pytest.raises(parallax.InvalidArgument, match="allgather input.*cuda"):
        dense.allgather(x)
    assert len(calls) == 5  # nothing more reached the library


@pytest.fixture
def fake_cuda(px, monkeypatch):
    """FakeCuda as far as the C ABI: the device operations' C calls record their options
    (memory kind, device, stream) and run as host operations on the memory behind them;
    Client.empty_tensor on a CUDA device gives arena memory as FakeCuda. Yields (the calls
    seen, the CUDA devices allocated on)."""
    from types import SimpleNamespace

    from parallax import _lib
    seen, allocated = [], []

    def on_host(name, real):
        def call(*args):
            opts = args[-2]._obj
            seen.append((name, opts.memory_kind, opts.device, opts.stream))
            opts.memory_kind, opts.device, opts.stream = _lib.MEMORY_HOST, -1, None
            return real(*args)
        return call

    for name in ("px_pull_rows_ex", "px_push_rows_ex", "px_read_rows_ex", "px_allreduce_ex",
                 "px_broadcast_ex"):
        monkeypatch.setattr(_lib.lib, name, on_host(name, getattr(_lib.lib, name)))
    monkeypatch.setattr(torch.cuda, "current_stream",
                        lambda device=None: SimpleNamespace(cuda_stream=0x5000))
    host_empty = parallax.Client.empty_tensor

    def empty_tensor(self, shape, dtype=None, device=None):
        if device is not None and torch.device(device).type == "cuda":
            allocated.append(torch.device(device))
            return host_empty(self, shape, dtype).as_subclass(FakeCuda)
        return host_empty(self, shape, dtype, device)

    monkeypatch.setattr(parallax.Client, "empty_tensor", empty_tensor)
    yield seen, allocated


def test_sparse_layer_device_path_end_to_end_on_fake_cuda(px, fake_cuda):
    """The Embedding's whole device path (staging in px_alloc_ex memory, PX_MEMORY_CUDA
    pulls, reads and pushes on the current stream) with FakeCuda tensors: the C calls get
    the device options, are checked, and run on the host memory behind them."""
    from parallax import _lib
    seen, allocated = fake_cuda
    rows, dim = 40, 3
    torch.manual_seed(0)
    w0 = torch.randn(rows, dim)
    emb = pxt.Embedding(rows, dim, name="dev.fakecuda", client=px, optimizer="adagrad",
                        lr=0.3, initial_accumulator=0.1, epsilon=1e-10)
    emb.load_state_dict({"weight": w0})
    ref = nn.Embedding(rows, dim)
    ref.weight.data.copy_(w0)
    opt = torch.optim.Adagrad(ref.parameters(), lr=0.3, initial_accumulator_value=0.1,
                              eps=1e-10)
    g = torch.Generator().manual_seed(3)
    for _ in range(4):
        idx = torch.randint(0, rows, (2, 5), generator=g)
        out = emb(idx.as_subclass(FakeCuda))
        assert out.device == torch.device("cuda", 0)
        out.sum().backward()
        opt.zero_grad()
        ref(idx).sum().backward()
        opt.step()
    emb.eval()
    with torch.no_grad():
        read = emb(torch.arange(rows).as_subclass(FakeCuda))
    emb.synchronize()
    want = ref.weight.data
    assert torch.allclose(torch.Tensor(read), want, rtol=1e-5, atol=1e-6)
    assert torch.allclose(emb.state_dict()["weight"], want, rtol=1e-5, atol=1e-6)
    cuda = (_lib.MEMORY_CUDA, 0, 0x5000)
    host = (_lib.MEMORY_HOST, -1, None)  # state_dict's read_all, through host memory
    assert seen == [("px_pull_rows_ex", *cuda), ("px_push_rows_ex", *cuda)] * 4 + [
        ("px_read_rows_ex", *cuda), ("px_read_rows_ex", *host)]
    assert allocated == [torch.device("cuda", 0)] * 4  # pull and push staging, once each


class FakeCudaParam(FakeCuda):
    """FakeCuda for parameters: torch functions on it give plain tensors (no alias nodes
    in the graph, so its AccumulateGrad hook is found as for a real parameter)."""
    __torch_function__ = torch._C._disabled_torch_function_impl

    def detach(self):  # nn.Parameter of a subclass needs detach() to keep the class
        return torch.Tensor.detach(self).as_subclass(FakeCudaParam)


def _fake_cuda_module(module: nn.Module) -> nn.Module:
    for m in module.modules():
        for name, p in list(m.named_parameters(recurse=False)):
            setattr(m, name, nn.Parameter(p.detach().clone().as_subclass(FakeCudaParam)))
    return module


def test_ddp_and_broadcast_device_path_end_to_end_on_fake_cuda(px, fake_cuda):
    """DistributedDataParallel with FakeCuda parameters: buckets allocated on the device,
    gradients views of them, each bucket's allreduce a PX_MEMORY_CUDA call on the current
    stream, training as a plain model does (one worker); broadcast_parameters packs CUDA
    and host tensors into one device buffer and one PX_MEMORY_CUDA broadcast."""
    import copy

    from parallax import _lib
    seen, allocated = fake_cuda
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    model = _fake_cuda_module(copy.deepcopy(ref))
    wrapped = pxt.DistributedDataParallel(model, client=px, bucket_cap_mb=0.0001,
                                          first_bucket_mb=0.0001, init_sync=False)
    assert [str(b.buffer.device) for b in wrapped.buckets] == ["cuda:0"] * 2
    assert allocated == [torch.device("cuda", 0)] * 2
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    spans = [(b.buffer.data_ptr(), b.buffer.data_ptr() + 4 * b.buffer.numel())
             for b in wrapped.buckets]
    for _ in range(3):
        x = torch.randn(5, 4, generator=g)
        opt.zero_grad()
        wrapped(x).pow(2).sum().backward()
        assert all(any(lo <= p.grad.data_ptr() < hi for lo, hi in spans)
                   for p in model.parameters())
        opt.step()
        ref_opt.zero_grad()
        ref(x).pow(2).sum().backward()
        ref_opt.step()
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.allclose(torch.Tensor(p.detach()), q.detach(), rtol=1e-6, atol=1e-7)
    cuda = (_lib.MEMORY_CUDA, 0, 0x5000)
    assert seen == [("px_allreduce_ex", *cuda)] * 6
    del seen[:]
    on_device = torch.arange(6, dtype=torch.float32).as_subclass(FakeCuda)
    on_host = torch.tensor([3], dtype=torch.int64)
    pxt.broadcast_parameters({"w": on_device, "step": on_host}, client=px)
    assert seen == [("px_broadcast_ex", *cuda)] and allocated[-1] == torch.device("cuda", 0)
    assert torch.equal(torch.Tensor(on_device), torch.arange(6, dtype=torch.float32))
    assert on_host.tolist() == [3]


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
