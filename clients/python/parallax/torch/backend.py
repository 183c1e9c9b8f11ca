"""torch.distributed's "parallax" backend: unchanged torch code runs its collectives
through the node's parallaxd.

    import torch.distributed as dist
    import parallax.torch                        # registers the backend
    dist.init_process_group("parallax")          # where "gloo" was
    model = torch.nn.parallel.DistributedDataParallel(model)

The process group uses the process's parallax client (parallax.torch.client(): settings
from PARALLAX_*, torchrun or Slurm), so the daemons' job is the torch job; its rank and world
size are init_process_group's, mapped to the daemons' ranks through the group's store. The
native part (parallax._c10d, C++ against the torch it was built with) is in the wheel, or
in a build tree beside libparallax; docs/torch-backend.md says what each collective costs
and what is refused.
"""

from __future__ import annotations

import collections
import importlib
import importlib.util
import os
import sysconfig
from typing import Any

import torch.distributed as dist

from .. import _lib
from . import ddp

BACKEND = "parallax"
# Variables a process group may register with the daemons (docs/torch-backend.md).
DEFAULT_MAX_VARIABLES = 1024

_generations: collections.Counter = collections.Counter()


def _extension() -> Any:
    """parallax._c10d: inside the package (a wheel), else in the build tree whose library
    the package loaded (<build>/clients/python/parallax beside <build>/clients/c)."""
    try:
        return importlib.import_module("parallax._c10d")
    except ImportError as e:
        inside = e
    name = "_c10d" + sysconfig.get_config_var("EXT_SUFFIX")
    path = os.path.normpath(os.path.join(os.path.dirname(_lib.library_path), "..", "python",
                                         "parallax", name))
    if not os.path.exists(path):
        raise ImportError(
            f"parallax: the torch.distributed backend is not built ({inside}; no {path}): it "
            "is compiled against Debian's libtorch-dev and pybind11-dev when CMake finds them")
    spec = importlib.util.spec_from_file_location("parallax._c10d", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _create_process_group(options: Any, pg_options: Any) -> Any:
    """The creator torch.distributed calls (extended API): options carries the group's
    store, rank, size, timeout, name and global ranks."""
    native = _extension()
    client = ddp.client()
    # A group name may come back (destroy_process_group, then init_process_group): each
    # incarnation gets variables of its own, in the same order on every rank.
    _generations[options.group_id] += 1
    group_id = f"{options.group_id}.{_generations[options.group_id]}"
    limit = int(os.environ.get("PARALLAX_C10D_MAX_VARIABLES", DEFAULT_MAX_VARIABLES))
    pg = native.ProcessGroupParallax(options.store, options.group_rank, options.group_size,
                                     options.timeout, group_id,
                                     list(options.global_ranks_in_group), int(client._h()),
                                     _lib.library_path, limit)
    pg._parallax_client = client  # the connection outlives the group
    return pg


def register() -> None:
    """Registers the backend with torch.distributed (import parallax.torch does it)."""
    if not dist.is_available() or BACKEND.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND, _create_process_group, extended_api=True)
