"""The wheel of the parallax package (distribution name parallaxd; pyproject.toml has the
metadata). Offline, with Debian's python3-build:

    python3 -m build --no-isolation --wheel clients/python

The wheel carries what CMake built: libparallax.so.1 (found inside the package first, see
parallax/_lib.py), parallaxd with its GPU plugin where CUDA was found, pxctl, and the
torch.distributed backend where libtorch-dev was found. They come from the build tree
$PX_BUILD_DIR, default the repository's build/; where that tree lacks them, this builds the
CMake target px_wheel_parts there first (as tools/quickstart build would, with Ninja).
setuptools' own files go under that tree too, never into the source tree.
"""

import os
import shutil
import subprocess
import sysconfig

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BUILD = os.path.abspath(os.environ.get("PX_BUILD_DIR") or os.path.join(ROOT, "build"))

with open(os.path.join(ROOT, "VERSION")) as f:  # the package's one version source
    VERSION = f.read().strip()

EXT_SUFFIX = sysconfig.get_config_var("EXT_SUFFIX")
# (path in the build tree, path in the package, required)
PARTS = [
    ("clients/c/libparallax.so.1", "libparallax.so.1", True),
    ("daemon/parallaxd", "_bin/parallaxd", True),
    ("tools/pxctl/pxctl", "_bin/pxctl", True),
    # parallaxd loads its GPU plugin from beside itself (daemon/gpu/gpu_loader.cc).
    ("daemon/libparallax_gpu.so", "_bin/libparallax_gpu.so", False),
    (f"clients/python/parallax/_c10d{EXT_SUFFIX}", f"_c10d{EXT_SUFFIX}", False),
]


def ensure_built():
    missing = [p for p, _, required in PARTS if required and not os.path.exists(
        os.path.join(BUILD, p))]
    if not missing:
        return
    if os.environ.get("PX_BUILD_DIR"):
        raise SystemExit(f"setup.py: {BUILD} lacks {', '.join(missing)}: build the CMake "
                         "target px_wheel_parts there, or unset PX_BUILD_DIR")
    env = dict(os.environ)
    env.setdefault("CMAKE_GENERATOR", "Ninja")
    if not os.path.exists(os.path.join(BUILD, "CMakeCache.txt")):
        subprocess.check_call(["cmake", "-S", ROOT, "-B", BUILD, "-DCMAKE_BUILD_TYPE=Release"],
                              env=env)
    subprocess.check_call(["cmake", "--build", BUILD, "--target", "px_wheel_parts", "-j",
                           os.environ.get("JOBS", "2")], env=env)


class BuildPyWithParts(build_py):
    """The Python sources, then the built parts and VERSION into the package."""

    def run(self):
        super().run()
        ensure_built()
        package = os.path.join(self.build_lib, "parallax")
        for source, target, required in PARTS:
            path = os.path.join(BUILD, source)
            if not os.path.exists(path):
                if required:
                    raise SystemExit(f"setup.py: {path} is missing")
                continue
            os.makedirs(os.path.dirname(os.path.join(package, target)), exist_ok=True)
            # copy2 follows the symlink: libparallax.so.1 -> libparallax.so.1.N
            shutil.copy2(path, os.path.join(package, target))
        shutil.copy2(os.path.join(ROOT, "VERSION"), os.path.join(package, "VERSION"))


class BinaryDistribution(Distribution):
    """The wheel holds native code: tag it for this interpreter and platform."""

    def has_ext_modules(self):
        return True


os.makedirs(os.path.join(BUILD, "clients", "python"), exist_ok=True)
setup(
    version=VERSION,
    distclass=BinaryDistribution,
    cmdclass={"build_py": BuildPyWithParts},
    options={"build": {"build_base": os.path.join(BUILD, "clients", "python", "setuptools")},
             "egg_info": {"egg_base": os.path.join(BUILD, "clients", "python")}},
)
