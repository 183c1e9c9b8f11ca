#!/usr/bin/python3
"""Checks that the package's version has one source, the repository's VERSION file.

    check_versions.py [--root DIR]      check the tree (default: this script's repository)
    check_versions.py --self-test       prove a drifted copy is caught, then check

CMake (the project, parallaxd --version), the Python wheel (clients/python/setup.py) and
the Python package (parallax.__version__) read VERSION itself; the files that cannot read
it, because their format wants a literal, are held to it here: the Rust crate's Cargo.toml
and the lock files naming it, and the Julia package's Project.toml. The ABI version (what
libparallax's SONAME and file name carry, parallax.abi_version) is another number, with its
own single source in include/parallax_c.h. Python stdlib only.
"""
import argparse
import os
import re
import shutil
import sys
import tempfile

# File -> how to find the version it must repeat; each pattern's group 1 is the version.
LITERAL_COPIES = {
    "clients/rust/Cargo.toml": r'(?ms)^\[package\]\s*\nname = "parallax"\s*\nversion = "([^"]*)"',
    "clients/rust/Cargo.lock": r'(?m)^name = "parallax"\nversion = "([^"]*)"',
    "examples/rust/Cargo.lock": r'(?m)^name = "parallax"\nversion = "([^"]*)"',
    "clients/julia/Parallax/Project.toml": r'(?m)^version = "([^"]*)"',
}
# Files that must read VERSION, not repeat it: a literal there would drift.
READERS = {
    "CMakeLists.txt": "${CMAKE_CURRENT_SOURCE_DIR}/VERSION",
    "clients/python/setup.py": '"VERSION"',
    "clients/python/parallax/_version.py": '"VERSION"',
}


def check(root):
    problems = []
    path = os.path.join(root, "VERSION")
    try:
        version = open(path).read().strip()
    except OSError as e:
        return [f"VERSION: {e.strerror}"]
    if not re.fullmatch(r"\d+\.\d+\.\d+", version):
        problems.append(f"VERSION: '{version}' is not MAJOR.MINOR.PATCH")
    for rel, pattern in LITERAL_COPIES.items():
        try:
            text = open(os.path.join(root, rel)).read()
        except OSError as e:
            problems.append(f"{rel}: {e.strerror}")
            continue
        m = re.search(pattern, text)
        if not m:
            problems.append(f"{rel}: no version found where one belongs ({pattern})")
        elif m.group(1) != version:
            problems.append(f"{rel}: version {m.group(1)}, but VERSION says {version}")
    for rel, needle in READERS.items():
        try:
            text = open(os.path.join(root, rel)).read()
        except OSError as e:
            problems.append(f"{rel}: {e.strerror}")
            continue
        if needle not in text:
            problems.append(f"{rel}: does not read VERSION (no {needle})")
        elif re.search(r"['\"]" + re.escape(version) + r"['\"]", text):
            problems.append(f"{rel}: repeats the version {version} literally; read VERSION")
    return problems


def self_test(root):
    with tempfile.TemporaryDirectory() as tmp:
        for rel in ["VERSION", *LITERAL_COPIES, *READERS]:
            os.makedirs(os.path.join(tmp, os.path.dirname(rel)), exist_ok=True)
            shutil.copy(os.path.join(root, rel), os.path.join(tmp, rel))
        if check(tmp):
            return "the copied files fail already: " + "; ".join(check(tmp))
        toml = os.path.join(tmp, "clients/rust/Cargo.toml")
        text = open(toml).read()
        open(toml, "w").write(re.sub(r'(?m)^version = "[^"]*"', 'version = "9.9.9"', text, 1))
        found = check(tmp)
        if not any("Cargo.toml" in p and "9.9.9" in p for p in found):
            return "a crate version that differs from VERSION was not caught"
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args()
    if args.self_test:
        failure = self_test(args.root)
        if failure:
            print(f"check_versions: self-test failed: {failure}")
            return 1
        print("check_versions: self-test passed (a drifted crate version is caught)")
    problems = check(args.root)
    for p in problems:
        print(f"check_versions: {p}")
    if problems:
        return 1
    print(f"check_versions: {open(os.path.join(args.root, 'VERSION')).read().strip()} "
          f"everywhere ({len(LITERAL_COPIES)} literal copies, {len(READERS)} readers)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
