#!/usr/bin/python3
"""Worker of `px-bench torch-dense`: a many-tensor dense training step, one process per
worker, under tools/px-cluster (with daemons for parallax, --no-daemons for ddp).

    torch_dense.py SYSTEM STEPS SLEEP_MS [PORT [MODEL]]
      SYSTEM: parallax (parallax.torch.DistributedDataParallel, 25 MB buckets) or
              parallax-bf16 (the same with compression=Compression.bf16) or
              ddp (torch DDP on gloo, 25 MB buckets, gradient_as_bucket_view=True) or
              ddp-fp16-hook (the same with DDP's fp16_compress_hook) or
              ddp-copy (the same with DDP's default gradient_as_bucket_view=False) or
              ddp-parallax (torch DDP as ddp, on torch.distributed's "parallax" backend:
              init_process_group("parallax"), the daemons under it)
      MODEL:  resnet50 (default): ResNet-50's 161 parameter tensors (25,557,032 float32
              values: 53 convs, 53 BatchNorms' weight and bias, the classifier), in
              torchvision's registration order; or lm: the demo language model's dense
              part (tools/lm/model.py's LSTM and projection: 6 tensors, 107,584 values)
Compute is synthetic: forward is a chain of one cheap autograd Function per parameter, so
backward visits the parameters in reverse order, and each Function's backward sleeps
SLEEP_MS (an accelerator busy with the layer: the CPU is left free, as with a GPU
backward) and then writes the parameter's gradient (a fresh tensor of its shape, as a
real backward does); AccumulateGrad then adds it into p.grad and the system's hook fires,
as in a real backward.

Timing, as every px-bench scenario: each step starts after a barrier; each rank times
forward + backward (until loss.backward() returns, when both systems have averaged the
gradients); a step's time is the maximum over all ranks (gathered after the timed loop);
rank 0 prints the median, min and max over the steps:
    RESULT <system>-sync <bytes> <median> <min> <max>
then the same steps under the system's no_sync() (compute alone, no communication):
    RESULT <system>-compute <bytes> <median> <min> <max>
and, for each, the CPU cores busy on average during the timed steps: the whole machine,
the parallaxd daemons, the workers (CPU <system>-<kind> <busy> <daemons> <workers>).
"""
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("GLOO_SOCKET_IFNAME", os.environ.get("PX_CLUSTER_IFACE", "lo"))
import torch  # noqa: E402
from torch import nn  # noqa: E402

WARMUP = 3


def lm_dense_shapes():
    """The shapes of the demo language model's dense parameters (tools/lm/model.py's Body:
    nn.LSTM(64, 128) and nn.Linear(128, 64)), in order."""
    embed, hidden = 64, 128
    return [(4 * hidden, embed), (4 * hidden, hidden), (4 * hidden,), (4 * hidden,),
            (embed, hidden), (embed,)]


def resnet50_shapes():
    """The shapes of torchvision's resnet50().parameters(), in order."""
    shapes = []

    def conv_bn(cin, cout, k):
        shapes.extend([(cout, cin, k, k), (cout,), (cout,)])

    conv_bn(3, 64, 7)
    inplanes = 64
    for planes, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for i in range(blocks):
            conv_bn(inplanes, planes, 1)
            conv_bn(planes, planes, 3)
            conv_bn(planes, planes * 4, 1)
            if i == 0:  # downsample, registered after the block's bn3
                conv_bn(inplanes, planes * 4, 1)
            inplanes = planes * 4
    shapes.extend([(1000, 2048), (1000,)])
    return shapes


class Layer(torch.autograd.Function):
    """y = x (a scalar); backward: sleep (the accelerator's work), then a fresh gradient
    for the parameter filled with `value`."""

    @staticmethod
    def forward(ctx, x, p, sleep_s, value):
        ctx.shape, ctx.sleep_s, ctx.value = p.shape, sleep_s, value
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        if ctx.sleep_s > 0:
            time.sleep(ctx.sleep_s)
        return g, torch.full(ctx.shape, ctx.value), None, None


class SyntheticModel(nn.Module):
    def __init__(self, sleep_s, value, shapes):
        super().__init__()
        self.params = nn.ParameterList(nn.Parameter(torch.zeros(s)) for s in shapes)
        self.sleep_s, self.value = sleep_s, value

    def forward(self, x):
        for p in self.params:
            x = Layer.apply(x, p, self.sleep_s, self.value)
        return x


def cpu_sample():
    """(machine-wide busy seconds, parallaxd seconds, torch_dense.py workers' seconds) of
    CPU so far: /proc is not namespaced by px-cluster's netns, so rank 0 sees every node's
    processes. Busy includes the kernel's TCP and softirq work wherever it is charged."""
    tick = os.sysconf("SC_CLK_TCK")
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    busy = sum(v) - v[3] - v[4]  # minus idle and iowait
    daemons = workers = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        used = int(fields[11]) + int(fields[12])  # utime + stime
        if cmd.split(b"\0")[0].endswith(b"parallaxd"):
            daemons += used
        elif b"torch_dense.py" in cmd:
            workers += used
    return busy / tick, daemons / tick, workers / tick


def install_trace(engine):
    """PX_TORCH_DENSE_TRACE=1 (diagnosis, parallax only): timestamps of the engine's hooks,
    bucket submissions and completions per step, printed to stderr per rank."""
    import parallax.request
    events = []
    clock = time.perf_counter
    ready, launch, sync = engine.on_grad_ready, engine._launch, engine.synchronize
    wait = parallax.request.Request.wait

    def on_ready(i):
        t = clock()
        ready(i)
        events.append(("hook", i, t, clock()))

    def on_launch(b):
        t = clock()
        launch(b)
        events.append(("submit", b.index, t, clock()))

    def on_sync():
        t = clock()
        sync()
        events.append(("sync", -1, t, clock()))

    def on_wait(self, timeout=None):
        t = clock()
        out = wait(self, timeout)
        events.append(("wait", self.what, t, clock()))
        return out
    engine.on_grad_ready, engine._launch, engine.synchronize = on_ready, on_launch, on_sync
    parallax.request.Request.wait = on_wait
    return events


def print_trace(rank, events, times):
    """Per step: where its time went (ms from the first hook)."""
    steps, current = [], []
    for e in events:
        current.append(e)
        if e[0] == "sync":
            steps.append(current)
            current = []
    for k, step in enumerate(steps):
        t0 = step[0][2]
        hooks = [e for e in step if e[0] == "hook"]
        hook_ms = sum(e[3] - e[2] for e in hooks) * 1e3
        submits = " ".join(f"b{e[1]}@{(e[2] - t0) * 1e3:.0f}+{(e[3] - e[2]) * 1e3:.1f}"
                           for e in step if e[0] == "submit")
        waits = " ".join(f"{e[1].split(chr(39))[1]}:{(e[3] - t0) * 1e3:.0f}"
                         for e in step if e[0] == "wait")
        sync = step[-1]
        print(f"TRACE rank {rank} step {k} total {times[k] * 1e3:.0f} ms: hooks {len(hooks)} "
              f"in {hook_ms:.1f} ms; last hook {(hooks[-1][3] - t0) * 1e3:.0f}; submit {submits}; "
              f"sync {(sync[2] - t0) * 1e3:.0f}-{(sync[3] - t0) * 1e3:.0f}; done {waits}",
              file=sys.stderr, flush=True)


def main():
    system, steps, sleep_ms = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    port = int(sys.argv[4]) if len(sys.argv) > 4 else 29561
    model_name = sys.argv[5] if len(sys.argv) > 5 else "resnet50"
    shapes = {"resnet50": resnet50_shapes, "lm": lm_dense_shapes}[model_name]()
    per_node = int(os.environ.get("PX_CLUSTER_WORKERS_PER_NODE", "1"))
    rank = int(os.environ["PX_CLUSTER_NODE"]) * per_node + int(os.environ["PARALLAX_LOCAL_RANK"])
    world = int(os.environ["PX_CLUSTER_NODES"]) * per_node
    torch.set_num_threads(1)
    model = SyntheticModel(sleep_ms / 1000, float(rank + 1), shapes)
    nbytes = sum(p.numel() * 4 for p in model.parameters())
    assert model_name != "resnet50" or (len(shapes) == 161 and nbytes == 25557032 * 4)
    assert model_name != "lm" or nbytes == 107584 * 4

    if system in ("parallax", "parallax-bf16"):
        import parallax
        import parallax.torch as pxt
        client = parallax.Client(arena_bytes=512 << 20, timeout=120, op_timeout=600)
        compression = pxt.Compression.bf16 if system == "parallax-bf16" else None
        wrapped = pxt.DistributedDataParallel(model, client=client, bucket_cap_mb=25,
                                              compression=compression)
        barrier = lambda: client.barrier(600)  # noqa: E731

        def per_step_max(times):
            t = client.empty(len(times), "float64")
            t[:] = times
            client.dense(f"timing{len(times)}.{per_step_max.n}", len(times), "float64",
                         op="max").allreduce(t).wait()
            per_step_max.n += 1
            return sorted(t.tolist())
        per_step_max.n = 0
    else:
        import torch.distributed as dist
        backend = "gloo"
        if system == "ddp-parallax":
            import parallax.torch  # noqa: F401  registers the "parallax" backend
            backend = "parallax"
        master = os.environ["PX_CLUSTER_HOSTS"].split(",")[0]
        dist.init_process_group(backend, init_method=f"tcp://{master}:{port}", rank=rank,
                                world_size=world)
        wrapped = nn.parallel.DistributedDataParallel(
            model, bucket_cap_mb=25, gradient_as_bucket_view=(system != "ddp-copy"))
        if system == "ddp-fp16-hook":
            # torch 1.13's gloo has no bfloat16 allreduce ("Invalid scalar type"), so
            # bf16_compress_hook cannot run on it; fp16 sends the same bytes.
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            wrapped.register_comm_hook(None, default_hooks.fp16_compress_hook)
        barrier = dist.barrier

        def per_step_max(times):
            t = torch.tensor(times, dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            return sorted(t.tolist())

    x = torch.zeros(())
    trace = os.environ.get("PX_TORCH_DENSE_TRACE") and system == "parallax"
    if trace:
        events = install_trace(wrapped._engine)

    def run(n, sync):
        times = []
        run.cpu = cpu_sample() if rank == 0 else None
        run.start = time.perf_counter()
        for _ in range(n):
            model.zero_grad(set_to_none=False)
            barrier()
            start = time.perf_counter()
            if sync:
                wrapped(x).backward()
            else:
                with wrapped.no_sync():
                    wrapped(x).backward()
            times.append(time.perf_counter() - start)
        if rank == 0:  # CPU-seconds per second of the timed loop (barriers included)
            wall = time.perf_counter() - run.start
            run.cores = [(b - a) / wall for a, b in zip(run.cpu, cpu_sample())]
        return times

    run(WARMUP, True)  # connections, page faults, DDP's bucket rebuild after iteration 1
    if trace:
        events.clear()
    synced = run(steps, True)
    cores = {"sync": run.cores if rank == 0 else None}
    if trace:
        print_trace(rank, events, synced)
    # Sanity: every rank's gradient is rank + 1, so the mean is (world + 1) / 2.
    got = model.params[0].grad.reshape(-1)[0].item()  # any shape (resnet50: 4-D, lm: 2-D)
    if abs(got - (world + 1) / 2) > 1e-5:
        print(f"WARNING: {system} rank {rank}: gradient {got}, expected {(world + 1) / 2}",
              file=sys.stderr)
    run(WARMUP, False)
    local = run(steps, False)
    cores["compute"] = run.cores if rank == 0 else None
    for kind, times in (("sync", synced), ("compute", local)):
        worst = per_step_max(times)
        if rank == 0:
            print(f"RESULT {system}-{kind} {nbytes} {worst[len(worst) // 2]:.6f} "
                  f"{worst[0]:.6f} {worst[-1]:.6f}", flush=True)
            print("CPU {}-{} {:.3f} {:.3f} {:.3f}".format(system, kind, *cores[kind]),
                  flush=True)
    barrier()
    sys.stdout.flush()
    if system == "parallax":
        client.close()
    else:
        # (ddp-parallax too: the same DDP.) torch 1.13's ProcessGroupGloo destructor (run by DDP's Reducer at exit) can join a
        # thread that waits for the GIL the destructor holds: a hang at exit in about one
        # run of ten. Everything is measured and printed: leave without the teardown.
        os._exit(0)


if __name__ == "__main__":
    main()
