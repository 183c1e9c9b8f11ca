#!/usr/bin/python3
"""The wheel as a user gets it (ctest python/wheel):

    wheel_check.py BUILD_DIR

1. builds the wheel from this checkout with Debian's python3-build, offline, taking the
   native parts from BUILD_DIR (clients/python/setup.py);
2. makes a fresh `python3 -m venv --system-site-packages` (torch and NumPy are Debian's)
   and installs the wheel with `pip install --no-index`;
3. checks the installed package: its version is VERSION's, its ABI version is the header's,
   it loads the libparallax.so.1 inside it, the `parallaxd` and `pxctl` console scripts run
   the programs the wheel carries;
4. runs examples/python/recommender.py on a 2 x 2 px-cluster whose daemons are the venv's
   `parallaxd`, from the venv's python, with no PYTHONPATH and no PARALLAX_LIB, and checks
   its result (it compares itself with single-process PyTorch) and the loss going down.

It prints how long the wheel took to build, and the time from `pip install` to the first
training step of the job (docs/python.md quotes it). Python stdlib only.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))


def fail(message):
    print(f"wheel_check: FAILED: {message}")
    sys.exit(1)


def run(cmd, env=None, timeout=300):
    done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=timeout)
    if done.returncode != 0:
        fail(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stdout}")
    return done.stdout


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__.strip().splitlines()[2].strip())
    build = os.path.abspath(sys.argv[1])
    version = open(os.path.join(ROOT, "VERSION")).read().strip()
    tmp = tempfile.mkdtemp(prefix="pxwheel-")
    # What a user's shell has: none of the checkout's variables.
    user_env = {k: v for k, v in os.environ.items()
                if k not in ("PYTHONPATH", "PARALLAX_LIB", "PARALLAXD")}
    try:
        t0 = time.monotonic()
        run(["/usr/bin/python3", "-m", "build", "--no-isolation", "--wheel", "--outdir",
             os.path.join(tmp, "dist"), os.path.join(ROOT, "clients", "python")],
            env=dict(user_env, PX_BUILD_DIR=build))
        wheels = os.listdir(os.path.join(tmp, "dist"))
        if len(wheels) != 1 or not re.fullmatch(
                rf"parallaxd-{re.escape(version)}-cp3\d+-cp3\d+-linux_x86_64\.whl", wheels[0]):
            fail(f"expected one parallaxd-{version} wheel for this platform, got {wheels}")
        wheel = os.path.join(tmp, "dist", wheels[0])
        print(f"wheel_check: built {wheels[0]} ({os.path.getsize(wheel) >> 10} KiB) "
              f"in {time.monotonic() - t0:.1f} s")
        if os.path.exists(os.path.join(ROOT, "clients", "python", "build")) or any(
                n.endswith(".egg-info") for n in os.listdir(os.path.join(ROOT, "clients",
                                                                         "python"))):
            fail("building the wheel wrote into the source tree (build/ or *.egg-info)")

        t1 = time.monotonic()
        venv = os.path.join(tmp, "venv")
        run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", venv], env=user_env)
        run([os.path.join(venv, "bin", "pip"), "install", "--no-index", wheel], env=user_env)
        installed = time.monotonic() - t1
        python = os.path.join(venv, "bin", "python")
        facts = run([python, "-c", "import parallax; print(parallax.__version__); "
                     "print(parallax.abi_version); print(parallax.library_path)"],
                    env=dict(user_env, PWD="/"))
        got_version, abi, library = facts.split()
        if got_version != version:
            fail(f"parallax.__version__ is {got_version}, VERSION says {version}")
        header = open(os.path.join(ROOT, "clients", "python", "parallax", "_lib.py")).read()
        want_abi = ".".join(re.findall(r"(?m)^ABI_(?:MAJOR|MINOR) = (\d+)", header))
        if abi != want_abi:
            fail(f"parallax.abi_version is {abi}, the binding declares {want_abi}")
        if not library.startswith(os.path.join(venv, "lib")):
            fail(f"the venv's parallax loaded {library}, not the library inside the package")
        daemon = os.path.join(venv, "bin", "parallaxd")
        said = run([daemon, "--version"], env=user_env)
        if not said.startswith(f"parallaxd {version} "):
            fail(f"parallaxd --version said {said!r}")
        run([os.path.join(venv, "bin", "pxctl"), "--help"], env=user_env)
        if any("/_c10d" in n for n in zipfile.ZipFile(wheel).namelist()):
            # The torch.distributed backend's native part loads from inside the package.
            where = run([python, "-c", "from parallax.torch import backend; "
                         "print(backend._extension().__file__)"], env=user_env).strip()
            if not where.startswith(os.path.join(venv, "lib")):
                fail(f"the venv's torch backend came from {where}")
            print(f"wheel_check: the torch.distributed backend loads from {where}")
        print(f"wheel_check: venv and pip install in {installed:.1f} s; parallax "
              f"{got_version} (ABI {abi}) from {library}; {said.strip()}")

        cluster = [os.path.join(ROOT, "tools", "px-cluster"), "--nodes", "2",
                   "--workers-per-node", "2", "--daemon", daemon, "--timeout", "150",
                   "--job", "wheel-check", "--", python,
                   os.path.join(ROOT, "examples", "python", "recommender.py")]
        proc = subprocess.Popen(cluster, env=user_env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        first_step = None
        lines = []
        for line in proc.stdout:
            sys.stdout.write(line)
            lines.append(line)
            if first_step is None and re.match(r"step +\d+ +loss", line):
                first_step = time.monotonic() - t1
        status = proc.wait()
        output = "".join(lines)
        if status != 0:
            fail(f"the 2 x 2 job exited {status}")
        if not re.search(r"(?m)^4 workers on 2 nodes", output):
            fail("the job did not run 4 workers on 2 nodes")
        if not re.search(r"(?m)^max relative difference from the single-process PyTorch "
                         r"reference .*: OK$", output):
            fail("the job's result differs from single-process PyTorch")
        losses = [float(x) for x in re.findall(r"(?m)^step +\d+ +loss ([0-9.]+)", output)]
        if len(losses) < 2 or losses[-1] >= losses[0]:
            fail(f"the loss did not go down: {losses}")
        print(f"wheel_check: OK: pip install to the first training step of a 2 x 2 job in "
              f"{first_step:.1f} s ({installed:.1f} s of it the venv and pip)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
