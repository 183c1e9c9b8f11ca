"""The package's version. Its one source is the repository's "VERSION" file: a wheel
(setup.py) and `cmake --install` put a copy of it in this package; a source checkout
(PYTHONPATH=clients/python) reads the repository's own."""

from __future__ import annotations

import os


def _read() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    for path in (os.path.join(here, "VERSION"),                     # wheel, cmake --install
                 os.path.join(here, "..", "..", "..", "VERSION")):  # source checkout
        try:
            with open(path) as f:
                return f.read().strip()
        except OSError:
            continue
    return "0+unknown"


__version__ = _read()
