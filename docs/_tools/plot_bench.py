#!/usr/bin/python3
"""Plots of the benchmark results under docs/bench, for the benchmark pages (issue 34).

    /usr/bin/python3 docs/_tools/plot_bench.py OUT_DIR

docs/build runs it before Sphinx; it writes OUT_DIR/NAME.png for each plot and
OUT_DIR/manifest.json, which the `pxplot` directive (docs/_ext/pxplots.py) reads to embed a
plot in its page with a caption naming its command, commit and machine. Nothing it writes
is committed.

Every number drawn is read from the JSON files named in the plot's `data`; nothing is
typed in here. The provenance of each plot (its command, its commit, its machine) comes
from the JSON where the JSON records it, else from the file's name (some carry a commit),
else from the benchmark page, and says which: "(page)" marks a fact the page states and
the JSON does not, "not recorded" a fact nobody wrote down. Where several runs of one
measurement are kept, every run is drawn (one marker per run), not an average.

To add a plot: keep the run's JSON under docs/bench (its commit in the file's name), write
a function decorated with @plot(...) below that draws from it, and show it in the page,
under the figures it draws, with

    ```{pxplot} NAME
    What it shows, in a sentence (the command, commit and machine are added).
    ```

The docs build fails on a plot no page shows, and the docs test on a blank one.
"""
import functools
import json
import os
import re
import sys
import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import ticker  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(os.path.dirname(HERE), "bench")

# The machine every JSON under docs/bench was measured on. The JSON records only its
# cores ("cores"); memory and system are what the benchmark pages state.
MACHINE_REST = "24 GiB, Debian 12 VM, no GPU (page)"

COLOURS = {"parallax": "C0", "mpi": "C1", "gloo": "C2", "ddp": "C3", "ddp-sparse": "C1",
           "ddp-dense": "C3", "ddp-parallax": "C4"}
ROUTE_COLOURS = {"ps": "C0", "hybrid": "C5", "auto": "C9", "alltoall-rows": "C1",
                 "alltoall-columns": "C4", "allgatherv": "C2", "allreduce": "C3",
                 "gloo sparse all_reduce": "C7"}
LINK_NAMES = {"netns-1gbit": "1 Gbit/s", "netns-5gbit": "5 Gbit/s",
              "netns-unlimited": "unlimited", "loopback": "loopback"}

PLOTS = []


def plot(name, page, title, data, command, commit, machine=None):
    """Registers a plot. data: the JSON files (under docs/bench) it reads."""
    def wrap(fn):
        PLOTS.append(dict(name=name, page=page, title=title, data=list(data),
                          command=command, commit=commit, machine=machine, draw=fn))
        return fn
    return wrap


@functools.lru_cache(maxsize=None)
def load(name):
    with open(os.path.join(BENCH, name), encoding="utf-8") as f:
        return json.load(f)


def _cores(obj):
    """Every "cores" a JSON records, at any depth."""
    if isinstance(obj, dict):
        return ({obj["cores"]} if "cores" in obj else set()).union(*map(_cores, obj.values()))
    if isinstance(obj, list):
        return set().union(*map(_cores, obj))
    return set()


def machine_of(files):
    cores = set().union(*(_cores(load(f)) for f in files))
    if len(cores) == 1:
        return f"{cores.pop()} cores (JSON), {MACHINE_REST}"
    return f"2 cores (page), {MACHINE_REST}"


def commit_of_name(name):
    """The commit a file's name carries (7 hex digits between dashes), or None."""
    m = re.search(r"-([0-9a-f]{7})(?=[-.])", name)
    return m.group(1) if m else None


def new_figure(spec, ncols=1, nrows=1, width=10.0, height=4.2, **kw):
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, height), squeeze=False, **kw)
    return fig, axes


def top_legend(fig, ncol):
    """A legend for the whole figure, placed by finish() between the title and the plots."""
    fig._px_legend_ncol = ncol


def finish(fig, spec, out_dir):
    """Title above, provenance below: command, commit, machine, data files."""
    for a in fig.axes:
        if not (a.lines or a.collections or a.patches or a.containers):
            sys.exit(f"plot_bench: {spec['name']}: a panel with nothing drawn "
                     "(did the JSON's fields change?)")
    lines = [f"command: {spec['command']}",
             f"commit: {spec['commit']}    machine: {spec['machine']}"]
    files = spec["data"]
    shown = ", ".join(files) if len(files) <= 4 else f"{files[0]} … {files[-1]} ({len(files)} files)"
    lines.append(f"data: docs/bench/{shown}" if len(files) == 1 else f"data (docs/bench): {shown}")
    text = "\n".join("\n".join(textwrap.wrap(line, 150, subsequent_indent="    "))
                     for line in lines)
    w, h = fig.get_size_inches()
    foot = 0.13 * (text.count("\n") + 1) + 0.15          # inches
    legend_ncol = getattr(fig, "_px_legend_ncol", 0)
    head = 0.3 + (0.2 * _legend_rows(fig, legend_ncol) if legend_ncol else 0)
    total = h + foot + head
    fig.set_size_inches(w, total)
    fig.suptitle(spec["title"], fontsize=11, fontweight="bold", y=1 - 0.08 / total, va="top")
    if legend_ncol:
        fig.legend(loc="upper center", ncol=legend_ncol, fontsize=7.5, frameon=False,
                   bbox_to_anchor=(0.5, 1 - 0.3 / total))
    fig.text(0.01, 0.05 / total, text, fontsize=7, family="monospace", va="bottom",
             ha="left", color="0.25")
    fig.tight_layout(rect=(0, foot / total, 1, 1 - head / total))
    path = os.path.join(out_dir, spec["name"] + ".png")
    fig.savefig(path, dpi=90, metadata={"Software": None})
    plt.close(fig)
    return path


def _legend_rows(fig, ncol):
    labels = {l for a in fig.axes for l in a.get_legend_handles_labels()[1]}
    return -(-len(labels) // ncol)


def log_y(a):
    """A log y axis labelled at 1, 2 and 5 of each decade, in plain numbers."""
    a.set_yscale("log")
    a.yaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    a.yaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
    a.yaxis.set_minor_formatter(ticker.NullFormatter())


def errbars(values, lows, highs):
    return [[v - lo for v, lo in zip(values, lows)], [hi - v for v, hi in zip(values, highs)]]


# --- one node -------------------------------------------------------------------------

@plot("local", "benchmarks/index", "One node: 64 MiB allreduce and 4 KiB round trip",
      ["local-9ecc173.json"], "build/tools/px-bench local --json (page)",
      "9ecc173 (file name)")
def _local(spec):
    d = load(spec["data"][0])
    fig, ax = new_figure(spec, ncols=2, width=10, height=3.8)
    a = ax[0][0]
    rows = d["allreduce_64mib"]
    labels = [f"{r['workers']} workers\n{r['memory']}" for r in rows]
    a.bar(labels, [r["algbw_gbps"] for r in rows],
          color=["C0" if r["memory"] == "arena" else "C7" for r in rows])
    a.axhline(d["memcpy_gbps"], color="k", ls="--", lw=1)
    a.text(len(rows) - 0.5, d["memcpy_gbps"], " memcpy, 1 thread", va="bottom", ha="right",
           fontsize=8)
    a.set_ylabel("algorithm bandwidth, GB/s")
    a.set_title("64 MiB f32 allreduce", fontsize=10)
    b = ax[0][1]
    lat = [("4 KiB allreduce\nround trip, 2 workers", d["rtt_4k_2_workers_us"]),
           ("eventfd ping-pong\n2 processes", d["eventfd_ping_pong_us"])]
    x = range(len(lat))
    b.bar([i - 0.2 for i in x], [v["median"] for _, v in lat], 0.4, label="median", color="C0")
    b.bar([i + 0.2 for i in x], [v["p99"] for _, v in lat], 0.4, label="p99", color="C9")
    b.set_xticks(list(x), [n for n, _ in lat])
    b.set_ylabel("µs")
    b.set_title("latency", fontsize=10)
    b.legend(fontsize=8)
    return fig


# --- cluster allreduce -----------------------------------------------------------------

@plot("allreduce-bandwidth", "benchmarks/allreduce",
      "Allreduce bus bandwidth by size, one worker per node, two runs",
      ["allreduce-1-worker-per-node.json", "allreduce-1-worker-per-node-run2.json"],
      "build/tools/px-bench allreduce --json --iterations 3 (page)",
      "run 1 at 0b778c4 (page); run 2 not recorded")
def _allreduce_bandwidth(spec):
    runs = [load(f)["results"] for f in spec["data"]]
    nodes = sorted({r["nodes"] for r in runs[0]})
    links = [l for l in LINK_NAMES if any(r["link"] == l for r in runs[0])]
    fig, ax = new_figure(spec, ncols=len(links), nrows=len(nodes), width=12, height=6,
                         sharex=True)
    for i, n in enumerate(nodes):
        for j, link in enumerate(links):
            a = ax[i][j]
            for system in ("parallax", "mpi", "gloo"):
                for k, results in enumerate(runs):
                    pts = sorted((r["bytes"], r["busbw_gbit"]) for r in results
                                 if r["nodes"] == n and r["link"] == link
                                 and r["system"] == system and r.get("workers_per_node", 1) == 1)
                    if not pts:
                        continue
                    a.plot([p[0] for p in pts], [p[1] for p in pts], color=COLOURS[system],
                           ls="-" if k == 0 else ":", marker="o" if k == 0 else "x", ms=3,
                           label=f"{system}, run {k + 1}" if i == 0 and j == 0 else None)
            a.set_xscale("log", base=2)
            a.set_title(f"N = {n}, {LINK_NAMES[link]}", fontsize=9)
            if j == 0:
                a.set_ylabel("bus bandwidth, Gbit/s")
            if i == len(nodes) - 1:
                a.set_xlabel("bytes")
            a.grid(alpha=0.3)
    top_legend(fig, 6)
    return fig


@plot("allreduce-64mib", "benchmarks/allreduce",
      "64 MiB allreduce at N = 4: median of the per-step maxima (min–max)",
      ["allreduce-n4x1-64mib-9ecc173.json", "allreduce-n4x1-64mib-3eb871f.json",
       "allreduce-n4x2-64mib-9ecc173.json", "allreduce-n4x2-64mib-3eb871f.json"],
      "build/tools/px-bench allreduce --json --nodes 4 --links 1,0,lo --sizes 67108864 "
      "--iterations 5 --workers-per-node 1 (and 2) (page)",
      "9ecc173 and 3eb871f (file names)")
def _allreduce_64mib(spec):
    fig, ax = new_figure(spec, ncols=2, width=11, height=4, sharey=True)
    for col, w in enumerate((1, 2)):
        a = ax[0][col]
        files = [f for f in spec["data"] if f"n4x{w}-" in f]
        links = [l for l in LINK_NAMES if any(r["link"] == l for r in load(files[0])["results"])]
        systems = ("parallax", "mpi", "gloo")
        width = 0.8 / (len(systems) * len(files))
        for s_i, system in enumerate(systems):
            for f_i, f in enumerate(files):
                res = {r["link"]: r for r in load(f)["results"] if r["system"] == system}
                xs, ys, lo, hi = [], [], [], []
                for l_i, link in enumerate(links):
                    if link in res:
                        r = res[link]
                        xs.append(l_i - 0.4 + width * (s_i * len(files) + f_i + 0.5))
                        ys.append(r["seconds"])
                        lo.append(r.get("seconds_min", r["seconds"]))
                        hi.append(r.get("seconds_max", r["seconds"]))
                a.bar(xs, ys, width, color=COLOURS[system], alpha=1.0 if f_i == 0 else 0.55,
                      yerr=errbars(ys, lo, hi), capsize=2, ecolor="0.3",
                      label=f"{system} at {commit_of_name(f)}" if col == 0 else None)
        a.set_xticks(range(len(links)), [LINK_NAMES[l] for l in links])
        a.set_title(f"4 nodes × {w} worker{'s' if w > 1 else ''}", fontsize=10)
        a.grid(axis="y", alpha=0.3)
    ax[0][0].set_ylabel("seconds per allreduce (lower is better)")
    top_legend(fig, 6)
    return fig


# --- small allreduce ---------------------------------------------------------------------

@plot("small-allreduce", "benchmarks/small-allreduce",
      "Small allreduce: recursive doubling against the ring and the peers (one dot per run)",
      ["allreduce-small-rd-384f7e7.json"], None,
      "384f7e7 (file name); ring: parallaxd built at 42017f6 (JSON)")
def _small_allreduce(spec):
    d = load(spec["data"][0])
    series = {}   # (system) -> {(nodes, link, bytes): [seconds per run]}
    for run in d["runs"]:
        for r in run["after"]["results"]:
            name = "parallax, recursive doubling" if r["system"] == "parallax" else r["system"]
            series.setdefault(name, {}).setdefault((r["nodes"], r["link"], r["bytes"]), []).append(r["seconds"])
        for r in run["before"]["results"]:
            series.setdefault("parallax, ring (before)", {}).setdefault(
                (r["nodes"], r["link"], r["bytes"]), []).append(r["seconds"])
    keys = sorted({k for s in series.values() for k in s}, key=lambda k: (-k[0], k[1] != "netns-1gbit", k[2]))
    fig, ax = new_figure(spec, width=10, height=4.2)
    a = ax[0][0]
    colours = {"parallax, recursive doubling": "C0", "parallax, ring (before)": "C9",
               "mpi": "C1", "gloo": "C2"}
    order = list(colours)
    for s_i, name in enumerate(order):
        for k_i, key in enumerate(keys):
            vals = series.get(name, {}).get(key, [])
            x = k_i - 0.3 + 0.2 * s_i
            a.scatter([x] * len(vals), [v * 1e3 for v in vals], color=colours[name], s=18,
                      label=name if k_i == 0 else None, zorder=3)
    log_y(a)
    a.set_xticks(range(len(keys)),
                 [f"N = {n}\n{LINK_NAMES[l]}\n{b // 1024} KiB" for n, l, b in keys], fontsize=8)
    a.set_ylabel("ms, median of per-iteration maxima")
    a.grid(axis="y", alpha=0.3, which="both")
    a.legend(fontsize=8)
    return fig


# --- sparse ----------------------------------------------------------------------------------

def _sparse_label(r):
    return "gloo sparse all_reduce" if r["system"] == "gloo" else r["route"]


@plot("sparse-routes", "benchmarks/sparse",
      "Sparse part of the step by route, 1 Gbit/s links, 2 workers per node (one run)",
      ["sparse-1gbit.json"], "build/tools/px-bench sparse --json --steps 15 (page)",
      "5c841ec (page)")
def _sparse_routes(spec):
    d = load(spec["data"][0])
    fig, ax = new_figure(spec, width=10, height=4)
    a = ax[0][0]
    nodes = sorted({r["nodes"] for r in d["results"]})
    labels = []
    for r in d["results"]:
        if _sparse_label(r) not in labels:
            labels.append(_sparse_label(r))
    width = 0.8 / len(labels)
    for l_i, label in enumerate(labels):
        xs, ys = [], []
        for n_i, n in enumerate(nodes):
            for r in d["results"]:
                if r["nodes"] == n and _sparse_label(r) == label:
                    xs.append(n_i - 0.4 + width * (l_i + 0.5))
                    ys.append(r["sparse_step_s"])
        a.bar(xs, ys, width, label=label, color=ROUTE_COLOURS.get(label, "C5"))
        for x, y in zip(xs, ys):
            a.text(x, y, f"{y:.3g}", ha="center", va="bottom", fontsize=7)
    log_y(a)
    a.set_xticks(range(len(nodes)), [f"{n} nodes × {d['workers_per_node']} workers" for n in nodes])
    a.set_ylabel("sparse part, s (log scale)")
    top_legend(fig, len(labels))
    a.grid(axis="y", alpha=0.3)
    return fig


@plot("sparse-hybrid-gloo", "benchmarks/sparse",
      "Hybrid route against gloo's sparse all_reduce at N = 4 × 2, five runs (min–max)",
      ["sparse-n4-hybrid-9ecc173-run1.json", "sparse-n4-hybrid-9ecc173-run2.json",
       "sparse-n4-hybrid-3eb871f-run1.json", "sparse-n4-hybrid-3eb871f-run2.json",
       "sparse-n4-hybrid-3eb871f-run3.json"],
      "build/tools/px-bench sparse --json --nodes 4 --routes hybrid --steps 15 (page)",
      "9ecc173 and 3eb871f (file names)")
def _sparse_hybrid_gloo(spec):
    fig, ax = new_figure(spec, width=10, height=3.8)
    a = ax[0][0]
    names = []
    for i, f in enumerate(spec["data"]):
        run = re.search(r"run\d+", f).group(0)
        names.append(f"{commit_of_name(f)} {run}")
        for r in load(f)["results"]:
            label = _sparse_label(r)
            dx = -0.15 if r["system"] == "parallax" else 0.15
            v, lo, hi = r["sparse_step_s"], r["sparse_step_min_s"], r["sparse_step_max_s"]
            a.errorbar([i + dx], [v], yerr=errbars([v], [lo], [hi]), fmt="o", capsize=3,
                       color=ROUTE_COLOURS.get(label, "C5"),
                       label=label if i == 0 else None)
    a.set_xticks(range(len(names)), names, fontsize=8)
    a.set_ylim(bottom=0)
    a.set_ylabel("sparse part, s")
    a.legend(fontsize=8)
    a.grid(axis="y", alpha=0.3)
    return fig


@plot("sparse-bf16", "benchmarks/sparse",
      "A bf16 wire: sparse part at N = 4 × 2, each pass of each run (median, min–max)",
      ["sparse-wire-bf16-n4-1.json", "sparse-wire-bf16-n4-2.json",
       "sparse-wire-bf16-n4-unlimited-1.json", "sparse-wire-bf16-n4-unlimited-2.json",
       "sparse-wire-bf16-n4-3.json"],
      "build/tools/px-bench sparse --json --nodes 4 --routes hybrid,hybrid-bf16 --steps 15; "
      "--routes ps,ps-bf16,ps,ps-bf16 --peers none --link-gbit 0 (and 1) (page)",
      "6529df9 (hybrid runs), 042cf24 (ps runs) (page)")
def _sparse_bf16(spec):
    fig, ax = new_figure(spec, width=11, height=4)
    a = ax[0][0]
    ticks = []
    x = 0
    for f in spec["data"]:
        d = load(f)
        link = "unlimited" if d["link_gbit"] == 0 else f"{d['link_gbit']} Gbit/s"
        seen = {}
        for r in d["results"]:
            if r["system"] == "gloo":
                continue          # 0.42-0.47 s: off this scale, in the page's table
            label = r["route"]
            seen[label] = seen.get(label, 0) + 1
            colour = "C0" if not label.endswith("bf16") else "C6"
            v, lo, hi = r["sparse_step_s"], r["sparse_step_min_s"], r["sparse_step_max_s"]
            a.errorbar([x], [v], yerr=errbars([v], [lo], [hi]), fmt="o", capsize=3, color=colour)
            ticks.append((x, f"{label}\n{link}\nrun {f[:-5].split('-')[-1]}"))
            x += 1
        x += 0.5
    a.set_xticks([t[0] for t in ticks], [t[1] for t in ticks], fontsize=6.5)
    a.set_ylabel("sparse part, s")
    a.set_ylim(bottom=0)
    a.grid(axis="y", alpha=0.3)
    a.plot([], [], "o", color="C0", label="f32 wire")
    a.plot([], [], "o", color="C6", label="bf16 wire")
    a.legend(fontsize=8)
    return fig


# --- language model --------------------------------------------------------------------------

@plot("lm", "benchmarks/lm",
      "Language model: words/s per system, and run 3's step split into compute and exposed "
      "communication", ["lm-n2-n4-run2.json", "lm-n2-n4-run3.json"],
      "build/tools/px-bench lm --json (page)", "not recorded")
def _lm(spec):
    runs = [load(f)["results"] for f in spec["data"]]
    systems = ["parallax", "ddp-sparse", "ddp-dense"]
    nodes = sorted({r["nodes"] for r in runs[0]})
    fig, ax = new_figure(spec, ncols=2, width=11, height=4)
    a = ax[0][0]
    width = 0.8 / len(systems)
    for s_i, system in enumerate(systems):
        for k, results in enumerate(runs):
            xs, ys = [], []
            for n_i, n in enumerate(nodes):
                for r in results:
                    if r["system"] == system and r["nodes"] == n:
                        xs.append(n_i - 0.4 + width * (s_i + 0.5) + (k - 0.5) * width * 0.4)
                        ys.append(r["words_per_s"])
            a.scatter(xs, ys, color=COLOURS[system], marker="o" if k == 0 else "s", s=22,
                      label=f"{system}, {spec['data'][k][len('lm-n2-n4-'):-5]}", zorder=3)
    a.set_xticks(range(len(nodes)), [f"{n} nodes × 2 workers" for n in nodes])
    a.set_ylabel("words/s (higher is better)")
    a.set_ylim(bottom=0)
    a.grid(axis="y", alpha=0.3)
    a.legend(fontsize=7, ncol=2)
    b = ax[0][1]
    last = runs[-1]
    labels, comp, comm, step, lo, hi = [], [], [], [], [], []
    for n in nodes:
        for system in systems:
            for r in last:
                if r["system"] == system and r["nodes"] == n:
                    labels.append(f"{system}\nN = {n}")
                    comp.append(r["compute_s"])
                    comm.append(r["step_s"] - r["compute_s"])
                    step.append(r["step_s"])
                    lo.append(r["step_s_min"])
                    hi.append(r["step_s_max"])
    x = range(len(labels))
    b.bar(x, comp, color="0.7", label="compute alone (median)")
    b.bar(x, [max(c, 0) for c in comm], bottom=comp, color="C3", label="exposed communication")
    b.errorbar(list(x), step, yerr=errbars(step, lo, hi), fmt="none", ecolor="k", capsize=3,
               label="step: median, min–max")
    b.set_xticks(list(x), labels, fontsize=7)
    b.set_ylabel("seconds per step (run 3)")
    b.legend(fontsize=7)
    b.grid(axis="y", alpha=0.3)
    return fig


@plot("lm-overhead", "benchmarks/lm",
      "Communication overhead ÷ compute, FIFO and priority, with and without prefetch "
      "(one dot per run)",
      ["lm-grid-n2-run1.json", "lm-grid-n2-run2.json", "lm-grid-n2-run3.json", "lm-grid-n4.json"],
      "build/tools/px-bench lm --json --nodes 2 --systems "
      "parallax-fifo,parallax,parallax-fifo-prefetch,parallax-prefetch (order changed each "
      "run), then --nodes 4 (page)", "d69d9cb (page)")
def _lm_overhead(spec):
    fig, ax = new_figure(spec, width=10, height=3.8)
    a = ax[0][0]
    systems = ["parallax-fifo", "parallax", "parallax-fifo-prefetch", "parallax-prefetch"]
    for f in spec["data"]:
        for r in load(f)["results"]:
            n = r["nodes"]
            x = systems.index(r["system"]) + (-0.12 if n == 2 else 0.12)
            a.scatter([x], [100 * (r["step_s"] - r["compute_s"]) / r["compute_s"]],
                      color="C0" if n == 2 else "C3", marker="o" if n == 2 else "s", s=24,
                      zorder=3)
    a.scatter([], [], color="C0", marker="o", label="N = 2 × 2 (runs 1–3)")
    a.scatter([], [], color="C3", marker="s", label="N = 4 × 2 (one run)")
    a.axhline(10, color="k", ls="--", lw=1)
    a.text(-0.45, 10, "target ≤ 10%", ha="left", va="bottom", fontsize=8)
    a.set_xticks(range(len(systems)), systems)
    a.set_ylabel("(median step − median compute) ÷ compute, %")
    a.set_ylim(bottom=0)
    a.grid(axis="y", alpha=0.3)
    a.legend(fontsize=8)
    return fig


# --- torch-dense ---------------------------------------------------------------------------

TORCH_RUNS = ["torch-dense-n4-4f03b5e-run2.json", "torch-dense-n4-4f03b5e-run3.json",
              "torch-dense-n4-4f03b5e-run4.json", "torch-dense-n4-e8a72e5-run5.json",
              "torch-dense-n4-e8a72e5-run7.json"]


@plot("torch-dense", "benchmarks/torch-dense",
      "ResNet-50-shaped dense step: DDP ÷ Parallax per run, and run 7's steps (min–max)",
      TORCH_RUNS,
      "build/tools/px-bench torch-dense --json --nodes 4 --workers-per-node 1,2 --links 1,0 (page)",
      "4f03b5e (runs 2–4), e8a72e5 (runs 5, 7) (file names)")
def _torch_dense(spec):
    fig, ax = new_figure(spec, ncols=2, width=11, height=4)
    a, b = ax[0][0], ax[0][1]
    configs = []
    for r in load(spec["data"][0])["results"]:
        c = (r["workers_per_node"], r["link"])
        if c not in configs:
            configs.append(c)
    names = [f"4 × {w}\n{LINK_NAMES[l]}" for w, l in configs]
    for k, f in enumerate(spec["data"]):
        res = {(r["system"], r["workers_per_node"], r["link"]): r for r in load(f)["results"]}
        ratios = [res[("ddp",) + c]["step_s"] / res[("parallax",) + c]["step_s"] for c in configs]
        label = f"{f[len('torch-dense-n4-'):-5]}"
        a.scatter([i - 0.2 + 0.1 * k for i in range(len(configs))], ratios, s=22, zorder=3,
                  color="C0" if "4f03b5e" in f else "C4", marker="os^Dv"[k], label=label)
    a.axhline(1.0, color="k", lw=1)
    a.axhline(1.3, color="k", ls="--", lw=1)
    a.text(len(configs) - 0.5, 1.3, "1.3× (target at 4 × 2, unlimited)", ha="right",
           va="bottom", fontsize=7)
    a.set_xticks(range(len(configs)), names, fontsize=8)
    a.set_ylabel("DDP step ÷ Parallax step (above 1: Parallax faster)")
    a.legend(fontsize=7, title="run", title_fontsize=7)
    a.grid(axis="y", alpha=0.3)
    last = {(r["system"], r["workers_per_node"], r["link"]): r for r in load(spec["data"][-1])["results"]}
    for s_i, system in enumerate(("parallax", "ddp")):
        rs = [last[(system,) + c] for c in configs]
        xs = [i - 0.2 + 0.4 * s_i for i in range(len(configs))]
        ys = [r["step_s"] for r in rs]
        b.bar(xs, ys, 0.38, color=COLOURS[system], label=f"{system}: step",
              yerr=errbars(ys, [r["step_min_s"] for r in rs], [r["step_max_s"] for r in rs]),
              capsize=3, ecolor="0.3")
        b.bar(xs, [r["compute_s"] for r in rs], 0.38, color="0.75", hatch="//",
              label="compute alone" if s_i == 0 else None)
    b.set_xticks(range(len(configs)), names, fontsize=8)
    b.set_ylabel("seconds per step, run 7")
    b.legend(fontsize=7)
    b.grid(axis="y", alpha=0.3)
    return fig


BACKEND_RUNS = ["torch-backend-n4-resnet50-dc0b7fd-run1.json",
                "torch-backend-n4-resnet50-dc0b7fd-run2.json",
                "torch-backend-n4-lm-dc0b7fd-run1.json", "torch-backend-n4-lm-dc0b7fd-run2.json"]


@plot("torch-backend", "benchmarks/torch-dense",
      "torch's DDP on the \"parallax\" backend and parallax.torch's DDP, each ÷ DDP on gloo "
      "(one dot per run)",
      BACKEND_RUNS,
      "build/tools/px-bench torch-dense --json [--model lm] --nodes 4 --workers-per-node 1,2 "
      "--links 1,0 (page)",
      "dc0b7fd (file names)")
def _torch_backend(spec):
    fig, ax = new_figure(spec, ncols=2, width=11, height=4)
    for a, model in zip((ax[0][0], ax[0][1]), ("resnet50", "lm")):
        files = [f for f in spec["data"] if f"-{model}-" in f]
        configs = []
        for r in load(files[0])["results"]:
            c = (r["workers_per_node"], r["link"])
            if c not in configs:
                configs.append(c)
        for k, f in enumerate(files):
            res = {(r["system"], r["workers_per_node"], r["link"]): r for r in load(f)["results"]}
            for s_i, system in enumerate(("ddp-parallax", "parallax")):
                ratios = [res[("ddp",) + c]["step_s"] / res[(system,) + c]["step_s"]
                          for c in configs]
                a.scatter([i - 0.15 + 0.3 * s_i + 0.06 * k for i in range(len(configs))], ratios,
                          s=22, zorder=3, color=COLOURS[system], marker="os"[k],
                          label=f"{system}, run {k + 1}")
        a.axhline(1.0, color="k", lw=1)
        a.axhline(1.1, color="k", ls="--", lw=1)
        a.axhline(0.95, color="k", ls=":", lw=1)
        a.text(len(configs) - 0.5, 1.1, "1.1× (target at 4 × 2)", ha="right", va="bottom",
               fontsize=7)
        a.text(len(configs) - 0.5, 0.95, "0.95× (target at 4 × 1)", ha="right", va="top",
               fontsize=7)
        a.set_xticks(range(len(configs)), [f"4 × {w}\n{LINK_NAMES[l]}" for w, l in configs],
                     fontsize=8)
        a.set_title("ResNet-50-shaped step" if model == "resnet50" else "the LM's dense part",
                    fontsize=9)
        a.set_ylabel("gloo DDP step ÷ this step (above 1: faster)")
        a.legend(fontsize=7)
        a.grid(axis="y", alpha=0.3)
    return fig


# --- soak ----------------------------------------------------------------------------------

@plot("soak", "benchmarks/soak", "Soak: each daemon's RSS and open fds over 10,000 steps",
      ["soak-run1.json"], None, "daemon built at 0673ad8 (page)")
def _soak(spec):
    d = load(spec["data"][0])
    fig, ax = new_figure(spec, ncols=2, width=11, height=3.8)
    a, b = ax[0][0], ax[0][1]
    steps = [c["step"] for c in d["curve"]]
    for node_i, daemon in enumerate(d["daemons"]):
        node = daemon["node"]
        rss = [next(x for x in c["daemons"] if x["node"] == node)["rss_kib"] / 1024 for c in d["curve"]]
        fds = [next(x for x in c["daemons"] if x["node"] == node)["fds"] for c in d["curve"]]
        colour = f"C{node_i}"
        a.plot(steps, rss, color=colour, label=f"node {node}")
        ref = daemon["rss_kib"]["at_sample"] / 1024
        a.axhspan(ref * (1 - d["tolerance"]), ref * (1 + d["tolerance"]), color=colour, alpha=0.08)
        b.plot(steps, fds, color=colour, label=f"node {node}", drawstyle="steps-post")
    for x in (a, b):
        x.axvline(d["sample_at"], color="k", ls=":", lw=1)
        x.set_xlabel("step")
        x.grid(alpha=0.3)
        x.legend(fontsize=8)
    a.set_ylabel("daemon RSS, MiB")
    a.set_title(f"band: ±{d['tolerance']:.0%} of the value at step {d['sample_at']:,}", fontsize=9)
    b.set_ylabel("open fds")
    b.set_ylim(0, max(max(c2["fds"] for c2 in c["daemons"]) for c in d["curve"]) * 1.3)
    return fig


# --- routes ---------------------------------------------------------------------------------

def _route_dots(a, files, route_order, shape_order=None):
    """One dot per (shape, route, file): a route measured in several runs gets several."""
    shapes = []
    for f in files:
        d = load(f)
        for s in d["shapes"]:
            key = (d["nodes"], s)
            if key not in shapes:
                shapes.append(key)
    if shape_order:
        shapes.sort(key=shape_order)
    routes = [r for r in route_order if any(r in load(f)["shapes"].get(s, {}).get("routes", {})
                                            for f in files for _, s in shapes)]
    width = 0.8 / len(routes)
    for f in files:
        d = load(f)
        for s, shape in d["shapes"].items():
            i = shapes.index((d["nodes"], s))
            for route, r in shape["routes"].items():
                if route not in routes:
                    continue
                x = i - 0.4 + width * (routes.index(route) + 0.5)
                v = r["sparse_step_s"]
                a.errorbar([x], [v * 1e3], yerr=errbars([v * 1e3], [r.get("sparse_step_min_s", v) * 1e3],
                                                         [r.get("sparse_step_max_s", v) * 1e3]),
                           fmt="o", ms=4, capsize=2, elinewidth=0.8,
                           color=ROUTE_COLOURS.get(route, "C5"))
    for route in routes:
        a.plot([], [], "o", color=ROUTE_COLOURS.get(route, "C5"), label=route)
    labels = []
    for n, s in shapes:
        sh = next(load(f)["shapes"][s] for f in files if load(f)["nodes"] == n and s in load(f)["shapes"])
        labels.append(f"N = {n}, {s}\n{sh['rows']:,} × {sh['dim']}\nZipf {sh['zipf']}")
    a.set_xticks(range(len(shapes)), labels, fontsize=6.5)
    log_y(a)
    a.set_ylabel("sparse part, ms (median, min–max)")
    a.grid(axis="y", alpha=0.3, which="both")
    a.legend(fontsize=7, ncol=len(routes))


@plot("route-estimates", "benchmarks/route-estimates",
      "Route estimates: each route's sparse step on each shape (one run each)",
      ["route-estimates-n2.json", "route-estimates-n2-dense.json", "route-estimates-n4.json"],
      "tools/bench/route_estimates.py --shapes … --routes ps,alltoall-rows,alltoall-columns,"
      "allgatherv[,allreduce] [--nodes 4] (page)", "d1c1f8b (page)",
      machine="2 cores (page), " + MACHINE_REST)
def _route_estimates(spec):
    fig, ax = new_figure(spec, width=10, height=4)
    _route_dots(ax[0][0], spec["data"],
                ["ps", "alltoall-rows", "alltoall-columns", "allgatherv", "allreduce"])
    return fig


ROUTE_AUTO = ["route-auto-grid2-n2.json", "route-auto-grid2-n4.json",
              "route-auto-every-row-n2.json", "route-auto-every-row-n4.json",
              "route-auto-grid2-n2-rerun2.json", "route-auto-grid2-n2-rerun3.json",
              "route-auto-high-z1.0-n4-60steps-run1.json", "route-auto-high-z1.0-n4-60steps-run2.json",
              "route-auto-high-z1.2-60steps-run1.json", "route-auto-high-z1.2-60steps-run2.json",
              "route-auto-high-z1.2-60steps-run3.json"]


@plot("route-auto", "benchmarks/route-auto",
      "auto against the fixed routes over the grid of α and skew (one dot per run; reruns "
      "of ps and auto included)", ROUTE_AUTO,
      "tools/bench/route_estimates.py --shapes every-row:4096:8:16384:0,lm1b-z0.8:…,"
      "high-z1.2:16384:64:8192:1.2 --routes ps,auto,alltoall-rows,alltoall-columns,"
      "allgatherv --estimate-steps 8 [--nodes 4] [--steps 60] (page)", "40b470e (page)",
      machine="2 cores (page), " + MACHINE_REST)
def _route_auto(spec):
    fig, ax = new_figure(spec, width=13, height=4.6)
    _route_dots(ax[0][0], spec["data"],
                ["ps", "auto", "alltoall-rows", "alltoall-columns", "allgatherv", "allreduce"],
                shape_order=lambda k: (k[0], k[1] != "every-row", k[1]))
    return fig


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = os.path.abspath(sys.argv[1])
    os.makedirs(out, exist_ok=True)
    plt.rcParams.update({"font.size": 9, "svg.hashsalt": "parallax"})
    manifest = []
    for spec in PLOTS:
        if spec["command"] is None:      # recorded in the JSON
            d = load(spec["data"][0])
            spec["command"] = d.get("driver") or " / ".join(d["commands"].values())
            spec["command"] += " (JSON)"
        if spec["machine"] is None:
            spec["machine"] = machine_of(spec["data"])
        fig = spec["draw"](spec)
        finish(fig, spec, out)
        manifest.append({k: v for k, v in spec.items() if k != "draw"})
    with open(os.path.join(out, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)
    print(f"plot_bench: {len(manifest)} plots in {out}")


if __name__ == "__main__":
    main()
