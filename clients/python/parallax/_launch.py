"""Console entry points of the wheel (pyproject.toml [project.scripts]): `parallaxd` and
`pxctl` run the programs the wheel carries in parallax/_bin, replacing this Python process
(exec), so signals and the exit status are the program's own. The programs expect Debian 12's
libraries (docs/python.md, "Installing with pip")."""

from __future__ import annotations

import os
import sys


def _exec(name: str) -> None:
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", name)
    if not os.access(path, os.X_OK):
        sys.exit(f"{name}: this installation of parallax has no {path} (installed from a "
                 f"source checkout, not from the wheel: build {name} with CMake instead)")
    os.execv(path, [name] + sys.argv[1:])


def parallaxd() -> None:
    """`parallaxd ...`: the daemon carried by the wheel."""
    _exec("parallaxd")


def pxctl() -> None:
    """`pxctl ...`: the daemon's control tool carried by the wheel."""
    _exec("pxctl")
