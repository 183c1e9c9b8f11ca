"""The process's default client for parallax.torch: one connection per process, made from
the environment (PARALLAX_*, torchrun or Slurm variables) on first use and shared by the
dense wrappers and the sparse layers given no client= (it lives in ddp.client())."""

from __future__ import annotations

import parallax

from . import ddp


def default_client() -> parallax.Client:
    """The process's client, connected on first use."""
    return ddp.client()


def set_default_client(client: parallax.Client) -> None:
    """Makes wrappers and layers created without client= use this one."""
    ddp._default_client = client
