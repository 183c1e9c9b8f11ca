"""Every public Python name of parallax and parallax.torch is in the API reference.

sphinx.ext.coverage only looks at names defined in the module it is given, and the
package's public names are defined in submodules and exported by parallax/__init__.py and
parallax/torch/__init__.py (their __all__). So this checks, once every page is read:
each class and function in those __all__ lists, and each public method and property a
class defines, is documented in the Python domain (autodoc documents only names with a
docstring, so a missing docstring is a missing entry). Each miss is a warning, which the
docs build (-W) turns into an error.
"""
import importlib
import inspect

from sphinx.ext.autodoc.mock import mock
from sphinx.util import logging

logger = logging.getLogger(__name__)

PACKAGES = ("parallax", "parallax.torch")


def _public_names(app):
    for pkg_name in PACKAGES:
        with mock(app.config.autodoc_mock_imports):   # as autodoc imports it: no libparallax
            pkg = importlib.import_module(pkg_name)
        for name in getattr(pkg, "__all__", []):
            obj = getattr(pkg, name)
            if not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue                    # data (ABI_MAJOR, ...) has no docstring to check
            full = f"{pkg_name}.{name}"
            yield full, obj
            if inspect.isclass(obj):
                for attr, value in vars(obj).items():
                    if attr.startswith("_"):
                        continue
                    if isinstance(value, (staticmethod, classmethod)):
                        value = value.__func__
                    if inspect.isfunction(value) or isinstance(value, property):
                        yield f"{full}.{attr}", value


def check(app, env):
    documented = set(env.get_domain("py").objects)
    known = set(app.config.pxcoverage_known_missing)
    for full, _ in _public_names(app):
        if full not in documented and full not in known:
            logger.warning("pxcoverage: %s is public but not in the API reference "
                           "(give it a docstring)", full)
        elif full in documented and full in known:
            logger.info("pxcoverage: %s is documented now: remove it from "
                        "pxcoverage_known_missing in docs/conf.py", full)


def setup(app):
    app.add_config_value("pxcoverage_known_missing", [], "env")
    app.connect("env-check-consistency", check)
    return {"version": "1", "parallel_read_safe": True}
