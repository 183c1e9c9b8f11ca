"""Elastic training in Horovod's shape: a training function that survives a lost node::

    import numpy as np
    import parallax.elastic as elastic

    state = elastic.State(params=np.zeros(1024), step=0)

    @elastic.run
    def train(client, state):
        grad = client.dense("grad", 1024, "float64")
        while state.step < 1000:
            g = compute_gradient(state.params)
            grad.allreduce(g).wait()
            state.params -= 0.01 * g
            state.step += 1
            state.commit()                 # what a reset goes back to

    train(state)

`run` connects a `Client` (settings from the environment, as `Client()` takes them),
brings every worker to the same state (`State.sync`) and calls the function. When a node
is lost mid-run (`PeerLost`: a worker, a daemon or a whole node gone), or nodes join
(`MembershipChanged`, itself a `PeerLost`), it closes the client, puts the state back to
its last `commit()`, connects again (a new run of the same job, which starts once the
cluster has re-formed: with membership on etcd a daemon started in the lost one's place
takes its index, or with membership_min_nodes the survivors re-form without it;
docs/elastic.md), syncs and calls the function again. A worker started in a lost one's
place runs the same script: `sync` gives it the state of the worker that committed the
most.

Create what belongs to a run inside the function: variables, and `parallax.torch`'s
wrappers and layers (run makes its client their default), so that each run builds them
on its client and world, whose size may have changed (the survivors, or a node that
joined: client.world_size, and PX_MEAN averages over it). Sparse tables live in the daemons: a
reset re-registers them. With membership on etcd they are handed over from the run that
ended where every partition survived (docs/elastic.md: the handover); otherwise they come
back from the newest periodic checkpoint when the daemons have one
(`restore`/`service.checkpoint_dir`), else from their initializer.
"""

from __future__ import annotations

import copy
import functools
import pickle
import sys
import time
from typing import Any, Callable, Optional

from .client import Client
from .errors import ConnectError, DeadlineExceeded, PeerLost

import numpy as np

__all__ = ["State", "run", "RESET_ERRORS"]

# What ends a run and starts a reset: a lost worker, daemon or node (this node's daemon gone
# may read as a failed connection). A failed connect or a deadline while the job re-forms
# is retried within reset_timeout.
RESET_ERRORS = (PeerLost, ConnectError)  # PeerLost covers MembershipChanged (nodes joined)
_RETRY_ERRORS = (PeerLost, ConnectError, DeadlineExceeded)


class State:
    """Named values that a reset goes back to: attributes (state.step, state.params).

    commit() keeps a copy of every value; restore() puts the copies back; sync(client)
    makes every worker's values those of the worker that committed the most (ties: the
    lowest rank), then commits. Values must pickle (NumPy arrays, numbers, dicts, torch
    tensors on the CPU...)."""

    def __init__(self, **values: Any):
        object.__setattr__(self, "_values", dict(values))
        object.__setattr__(self, "_saved", {})
        object.__setattr__(self, "commits", 0)  # how many commit() calls this worker made
        object.__setattr__(self, "resets", 0)  # how many resets run() went through
        object.__setattr__(self, "_on_reset", [])
        self.commit()

    def __getattr__(self, name: str) -> Any:
        values = object.__getattribute__(self, "_values")
        if name in values:
            return values[name]
        raise AttributeError(f"State has no value '{name}'")

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("commits", "resets"):
            object.__setattr__(self, name, value)
        else:
            self._values[name] = value

    def values(self) -> dict:
        """The current values (a copy of the mapping, not of the values)."""
        return dict(self._values)

    def commit(self) -> None:
        """Keeps a copy of every value: a reset returns here."""
        object.__setattr__(self, "_saved", copy.deepcopy(self._values))
        object.__setattr__(self, "commits", self.commits + 1)

    def restore(self) -> None:
        """Puts back the values of the last commit()."""
        object.__setattr__(self, "_values", copy.deepcopy(self._saved))

    def on_reset(self, callback: Callable[[], None]) -> None:
        """callback() runs after each reset's restore, before the function runs again (to
        rebuild what depends on the world: buckets, a learning rate scaled by its size)."""
        self._on_reset.append(callback)

    def sync(self, client: Client) -> int:
        """Every worker takes the values of the one that committed the most; returns its
        rank. Collective: every worker of the job calls it (run() does, before each run)."""
        world = client.world_size
        counts = np.zeros(world, dtype=np.int64)
        mine = np.array([self.commits], dtype=np.int64)
        client.dense("parallax.elastic.commits", 1, "int64").allgather(mine, counts).wait()
        root = int(np.argmax(counts))  # the first of the highest: the lowest such rank
        payload = pickle.dumps(self._values, protocol=pickle.HIGHEST_PROTOCOL)
        length = np.array([len(payload)], dtype=np.int64)
        client.dense("parallax.elastic.length", 1, "int64").broadcast(length, root=root).wait()
        words = max(1, (int(length[0]) + 7) // 8)
        buf = np.zeros(words, dtype=np.int64)
        if client.rank == root:
            buf.view(np.uint8)[: len(payload)] = np.frombuffer(payload, dtype=np.uint8)
        client.dense(f"parallax.elastic.state.{words}", words, "int64").broadcast(
            buf, root=root).wait()
        if client.rank != root:
            values = pickle.loads(buf.view(np.uint8)[: int(length[0])].tobytes())
            object.__setattr__(self, "_values", values)
        object.__setattr__(self, "_saved", copy.deepcopy(self._values))
        object.__setattr__(self, "commits", int(counts[root]))
        return root


def _connect_and_sync(state: State, deadline: float, client_options: dict) -> Client:
    """A Client whose workers have synced state, retried until deadline while the daemon is
    down or the job's new run is still forming; past it, the last error is raised."""
    while True:
        client = None
        try:
            client = Client(**client_options)
            state.sync(client)
            return client
        except _RETRY_ERRORS:
            if client is not None:
                client.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def run(func: Optional[Callable] = None, *, reset_timeout: float = 120.0,
        max_resets: Optional[int] = None, **client_options: Any) -> Callable:
    """Decorates ``func(client, state, *args, **kwargs)`` so that calling it with a State runs
    it elastically (the module's docstring). reset_timeout: how long a reset may take
    (connect and sync, waiting for the cluster to re-form); max_resets: give up (re-raise)
    after that many (None: never). client_options go to Client()."""

    def decorate(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
            while True:
                # Outside the try below: a reset that cannot connect and sync in time
                # raises, it does not count as one more reset.
                client = _connect_and_sync(state, time.monotonic() + reset_timeout,
                                           client_options)
                try:
                    # parallax.torch's wrappers and layers created in fn without client=
                    # use this run's client: built anew on each run, on the new world.
                    torch_side = sys.modules.get("parallax.torch")
                    if torch_side is not None:
                        torch_side.set_default_client(client)
                    return fn(client, state, *args, **kwargs)
                except RESET_ERRORS as error:
                    if max_resets is not None and state.resets >= max_resets:
                        raise
                    state.resets += 1
                    print(f"parallax.elastic: reset {state.resets} after: {error}",
                          file=sys.stderr, flush=True)
                    state.restore()
                    for callback in state._on_reset:
                        callback()
                finally:
                    client.close()

        return wrapper

    return decorate(func) if func is not None else decorate
