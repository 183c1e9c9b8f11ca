"""The process's default client for parallax.torch layers: one connection per process,
made from the environment (PARALLAX_*, torchrun or Slurm variables) on first use."""

from __future__ import annotations

import atexit
from typing import Optional

import parallax

_client: Optional[parallax.Client] = None


def default_client() -> parallax.Client:
    """The process's client, connected on first use and closed at exit."""
    global _client
    if _client is None or _client._handle is None:
        _client = parallax.Client()
        atexit.register(_client.close)
    return _client


def set_default_client(client: parallax.Client) -> None:
    """Makes layers created without client= use this one."""
    global _client
    _client = client
