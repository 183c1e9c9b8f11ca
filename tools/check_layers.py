#!/usr/bin/python3
"""Checks that every #include of the project's C, C++ and CUDA sources follows the layer
table (docs/architecture.md, Layout of the code): a folder includes only from the folders
below it, and never from one it must not know about.

    check_layers.py [--root DIR]        check the tree (default: this script's repository)
    check_layers.py --self-test         prove a forbidden include is caught, then check

The rules are LAYERS below, one entry per folder: what it may include besides itself. A
file's layer is the longest folder of LAYERS its path starts with; an include's is the
same for the file it names, found as the compiler would (beside the including file, then
from the root, `parallax_c.h` in include/, a FlatBuffers or Cap'n Proto header generated
from the schema beside it). Includes that name no file of the project (the standard
library, libuv, ...) are not checked. Where the code breaks the table today, the include
is named in ALLOWED, with why; the check prints them on every run and fails on one that is
no longer needed, so the list only shrinks. Python stdlib only.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

# C, C++ and CUDA sources, the ones clang-format checks too (tools/check_format.py).
SOURCE_SUFFIXES = (".c", ".cc", ".cpp", ".cxx", ".h", ".hh", ".hpp", ".cu", ".cuh")

TRANSPORT = ["transport/ipc", "transport/kernels", "transport/collectives", "transport/fabric"]

# folder -> the folders it may include besides itself, and why (the layer table's "must not
# know about" column). Data flows one way: client -> session (daemon/front) -> scheduler
# (daemon/dense) -> router (daemon/sparse) -> (collective | shard) -> transport, and nothing
# but tests include daemon/.
LAYERS = {
    "include": ([], "the only public header, pure C99: nothing of the project"),
    "clients/c": (["include", "transport/ipc", "transport/kernels"],
                  "libparallax: the ABI over the arena and rings; no daemon, fabric, "
                  "collectives or shards"),
    # The other bindings (Python, Rust, Julia, a C++ extension one day): the C ABI alone.
    "clients": (["include"], "bindings over the C ABI alone"),
    "daemon/front": (["include", "daemon/dense", "daemon/sparse", "daemon/gpu", "daemon/cluster",
                      "daemon/observe", "daemon/common", "sharding"] + TRANSPORT,
                     "the daemon's front: every layer below it"),
    "daemon/dense": (["include", "daemon/sparse", "daemon/gpu", "daemon/cluster",
                      "daemon/observe", "daemon/common"] + TRANSPORT,
                     "the scheduler: hands sparse steps to the router, knows no sparse "
                     "semantics (sharding/) and nothing of the front"),
    "daemon/sparse": (["include", "daemon/gpu", "daemon/cluster", "daemon/observe",
                       "daemon/common", "sharding"] + TRANSPORT,
                      "the router: no sockets (the front), not the scheduler"),
    "daemon/gpu": (["include", "daemon/cluster", "daemon/observe", "daemon/common"] + TRANSPORT,
                   "the GPU backend: nothing of front, dense or sparse"),
    "daemon/cluster": (["include", "daemon/observe", "daemon/common"] + TRANSPORT,
                       "the control plane: no shards or optimizers (sharding/), nothing above"),
    "daemon/observe": (["include", "daemon/common", "sharding"] + TRANSPORT,
                       "observability: read through hooks the front fills, nothing above"),
    "daemon/common": (["include", "sharding"] + TRANSPORT,
                      "what every daemon layer shares: no other daemon folder"),
    "transport/ipc": (["transport/kernels"], "the arena, rings, control framing: no fabric"),
    "transport/kernels": ([], "dtypes, reductions, CUDA kernels: everything else is above"),
    "transport/collectives": (["transport/kernels", "transport/ipc"],
                              "algorithms over CollectiveTransport: no fabric, no sparse "
                              "semantics"),
    "transport/fabric": (["transport/kernels", "transport/ipc"],
                         "daemon to daemon: no optimizers (sharding/), not the collectives"),
    "sharding": (["transport/kernels"], "sparse-variable state: no sockets, no fabric"),
    "tools": (["include", "clients/c", "sharding"] + TRANSPORT,
              "pxctl, px-bench, demos: the ABI and the primitives, never daemon/"),
    "examples": (["include"], "programs an integrator writes: the C ABI alone"),
    "tests": (["include", "clients", "daemon", "sharding", "tools", "transport"],
              "tests reach every layer"),
}

# Includes that break the table today: (including file, included file, why it stays).
ALLOWED = [
    # The sparse defaults live in one place, SparseOptions' member initialisers (a header
    # alone: libparallax links no sharding code); px_sparse_options_init reads them there.
    ("clients/c/client.cc", "sharding/sparse_spec.h",
     "px_sparse_options_init reads the defaults from SparseOptions (header only)"),
    # Completer exposes a worker's device memory; daemon/gpu sits above daemon/common in the
    # table. A forward declaration of gpu::DeviceRegions and find_device_buffer moved into
    # daemon/gpu would remove it.
    ("daemon/common/completer.h", "daemon/gpu/device_regions.h",
     "Completer::device_regions() and find_device_buffer use gpu::DeviceRegions"),
    # The fabric endpoint implements the interface the collectives run over (an interface
    # with no includes of the project).
    ("transport/fabric/fabric_endpoint.h", "transport/collectives/collective_transport.h",
     "FabricEndpoint implements CollectiveTransport"),
]

INCLUDE_RE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


def layer_of(path):
    """The longest folder of LAYERS that path (relative, with /) lies in, or None."""
    best = None
    for folder in LAYERS:
        if path == folder or path.startswith(folder + "/"):
            if best is None or len(folder) > len(best):
                best = folder
    return best


def may_include(src_layer, dst_layer):
    if src_layer == dst_layer:
        return True
    allowed = LAYERS[src_layer][0]
    return any(dst_layer == a or dst_layer.startswith(a + "/") for a in allowed)


def skip_dir(root, rel, name):
    """A folder that is not the project's own source: build trees, hidden folders."""
    if name.startswith(".") or name.startswith("build") or name in ("__pycache__",
                                                                    "node_modules"):
        return True
    return os.path.exists(os.path.join(root, rel, name, "CMakeCache.txt"))


def project_files(root):
    """Every file of the project (relative paths with /): git's tracked and untracked but not
    ignored files where root is a git work tree, else a walk that skips build trees."""
    if os.path.exists(os.path.join(root, ".git")):
        try:
            out = subprocess.run(
                ["git", "-C", root, "ls-files", "-z", "--cached", "--others",
                 "--exclude-standard"], check=True, capture_output=True).stdout
            names = sorted(set(n for n in out.decode().split("\0") if n))
            return [n for n in names if os.path.isfile(os.path.join(root, n))]
        except (OSError, subprocess.CalledProcessError):
            pass
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        rel = "" if rel == "." else rel
        dirnames[:] = sorted(d for d in dirnames if not skip_dir(root, rel, d))
        files.extend(os.path.join(rel, f).replace(os.sep, "/") for f in sorted(filenames))
    return files


def project_sources(root):
    return [f for f in project_files(root) if f.endswith(SOURCE_SUFFIXES)]


def generated_headers(files):
    """Headers generated in the build tree, by name -> the schema's path (its layer's)."""
    gen = {}
    for f in files:
        folder, name = os.path.split(f)
        if name.endswith(".fbs"):
            gen[name[:-4] + "_generated.h"] = os.path.join(folder, name[:-4] + "_generated.h")
        elif name.endswith(".capnp"):
            gen[name + ".h"] = os.path.join(folder, name + ".h")
    return gen


def resolve(root, including, name, quoted, files, generated):
    """The project file an include names (relative path), or None for a system header."""
    here = os.path.dirname(including)
    candidates = ([os.path.normpath(os.path.join(here, name))] if quoted else []) + [
        os.path.normpath(name), os.path.join("include", name)]
    for c in candidates:
        c = c.replace(os.sep, "/")
        if c in files:
            return c
    if name in generated:
        return generated[name]
    # A path from the root into a folder of the table that does not exist (yet): its layer.
    if layer_of(name) and "/" in name:
        return name
    return None


def check(root, out=sys.stdout):
    """Returns the list of violations (strings) and prints the summary."""
    files_all = project_files(root)
    files = set(files_all)
    generated = generated_headers(files_all)
    sources = [f for f in files_all if f.endswith(SOURCE_SUFFIXES)]
    allowed = {(a, b): why for a, b, why in ALLOWED}
    used = set()
    errors = []
    edges = 0
    for src in sources:
        src_layer = layer_of(src)
        if src_layer is None:
            errors.append("%s: in no folder of the layer table (add it to LAYERS in "
                          "tools/check_layers.py)" % src)
            continue
        with open(os.path.join(root, src), encoding="utf-8", errors="replace") as fh:
            for lineno, line in enumerate(fh, 1):
                m = INCLUDE_RE.match(line)
                if not m:
                    continue
                dst = resolve(root, src, m.group(2), m.group(1) == '"', files, generated)
                if dst is None:
                    continue
                edges += 1
                dst_layer = layer_of(dst)
                if dst_layer is None:
                    errors.append("%s:%d: includes %s, in no folder of the layer table"
                                  % (src, lineno, dst))
                elif not may_include(src_layer, dst_layer):
                    if (src, dst) in allowed:
                        used.add((src, dst))
                        continue
                    errors.append("%s:%d: includes %s: %s may not include %s (%s)"
                                  % (src, lineno, dst, src_layer, dst_layer,
                                     LAYERS[src_layer][1]))
    for a, b, why in ALLOWED:
        if (a, b) not in used:
            errors.append("ALLOWED lists %s -> %s, which the tree no longer needs: remove it "
                          "from tools/check_layers.py" % (a, b))
    print("check_layers: %d sources, %d includes of project files, %d allowed exceptions:"
          % (len(sources), edges, len(ALLOWED)), file=out)
    for a, b, why in ALLOWED:
        print("  allowed: %s -> %s (%s)" % (a, b, why), file=out)
    return errors


# --- self-test ----------------------------------------------------------------------


def write(root, path, text):
    full = os.path.join(root, path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "w") as fh:
        fh.write(text)


def self_test():
    """A synthetic tree: legal includes pass; each forbidden one is caught, named by file."""
    failures = []
    legal = {
        "include/parallax_c.h": "",
        "transport/kernels/reduce.h": "#include <cstdint>\n",
        "transport/ipc/ring.h": '#include "transport/kernels/reduce.h"\n',
        "transport/ipc/control.fbs": "",
        "transport/ipc/channel.h": '#include "control_generated.h"\n',
        "sharding/spec.h": '#include "transport/kernels/reduce.h"\n',
        "daemon/common/job.h": '#include "parallax_c.h"\n#include "transport/ipc/ring.h"\n',
        "daemon/front/session.cc": '#include "daemon/common/job.h"\n#include "local.h"\n',
        "daemon/front/local.h": "",
        "clients/c/client.cc": '#include "parallax_c.h"\n#include "transport/ipc/ring.h"\n',
        "tests/unit/test_job.cc": '#include "daemon/front/local.h"\n',
    }
    for a, b, _ in ALLOWED:  # every allowed exception present, so none is reported stale
        legal.setdefault(a, "")
        legal[a] += '#include "%s"\n' % b
        legal.setdefault(b, "")
    forbidden = [
        ("transport/ipc/bad.h", '#include "daemon/front/session.h"\n'),  # upward
        ("transport/kernels/bad.cc", '#include "transport/ipc/ring.h"\n'),
        ("sharding/bad.cc", '#include "transport/fabric/endpoint.h"\n'),  # must not know
        ("clients/c/bad.cc", '#include "daemon/common/job.h"\n'),
        ("clients/python/ext/bad.cc", '#include "transport/ipc/ring.h"\n'),
        ("daemon/common/bad.h", '#include "daemon/dense/scheduler.h"\n'),
        ("daemon/dense/bad.cc", '#include "sharding/spec.h"\n'),
        ("tools/bad.cc", '#include "daemon/common/job.h"\n'),
        ("transport/ipc/bad2.h", '#include "channel.h"\n'),  # beside it: same layer...
        ("transport/kernels/bad2.h", '#include "../ipc/ring.h"\n'),  # ...relative, upward
        ("newfolder/x.cc", ""),  # in no folder of the table
    ]
    quiet = open(os.devnull, "w")
    with tempfile.TemporaryDirectory() as tmp:
        for path, text in legal.items():
            write(tmp, path, text)
        errors = check(tmp, out=quiet)
        if errors:
            failures.append("self-test: a legal tree fails: %s" % errors)
        for path, text in forbidden:
            write(tmp, path, text)
            errors = check(tmp, out=quiet)
            caught = [e for e in errors if e.startswith(path)]
            expect_none = path == "transport/ipc/bad2.h"
            if expect_none and errors:
                failures.append("self-test: %s (legal) reported: %s" % (path, errors))
            elif not expect_none and not caught:
                failures.append("self-test: %s not caught (%s)" % (path, text.strip()))
            os.remove(os.path.join(tmp, path))
        # An allowed exception the tree no longer has is reported.
        a, b, _ = ALLOWED[0]
        write(tmp, a, "")
        if not any(e.startswith("ALLOWED lists %s" % a) for e in check(tmp, out=quiet)):
            failures.append("self-test: a stale ALLOWED entry is not reported")
    quiet.close()
    return failures


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(
        __file__))), help="the repository (default: this script's)")
    ap.add_argument("--self-test", action="store_true",
                    help="first prove on a synthetic tree that forbidden includes are caught")
    args = ap.parse_args()
    failures = self_test() if args.self_test else []
    if args.self_test and not failures:
        print("check_layers: self-test passed (a forbidden include is caught)")
    failures += check(args.root)
    for f in failures:
        print("check_layers: " + f, file=sys.stderr)
    if failures:
        print("check_layers: %d violations of the layer table (docs/architecture.md)"
              % len(failures), file=sys.stderr)
        return 1
    print("check_layers: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
