"""The daemon's GPU backend (daemon/gpu) with real daemons: what pxctl status and the
metrics report, gpu.mode required on a node without a GPU, bad backends, and that parallaxd
itself links neither CUDA nor NCCL. On a machine with a GPU the same tests expect devices
(a GPU is there when /dev/nvidia0 is)."""
import os
import subprocess

from conftest import metric, pxctl

PARALLAXD = os.environ.get("PARALLAXD", "")
BUILT_WITH_CUDA = os.environ.get("PX_HAVE_CUDA") == "1"
HAS_GPU = os.path.exists("/dev/nvidia0")


def start_refused(scratch, *args):
    return subprocess.run([PARALLAXD, "--foreground", "--socket", scratch + "/refused.sock"] +
                          list(args), capture_output=True, text=True, timeout=60)


def needed(path):
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True)
    return [line.split("[")[1].rstrip("]") for line in out.stdout.splitlines() if "(NEEDED)" in line]


def test_gpu_status_and_metrics_report_what_the_backend_found(daemons, scratch):
    d = daemons.start("auto")
    s = pxctl(d, "status").json
    assert s["gpu_mode"] == "auto"
    samples = d.metrics()
    assert metric(samples, "parallax_gpu_devices") == s["gpu_devices"]
    if not BUILT_WITH_CUDA:
        assert s["gpu_devices"] == 0
        assert s["gpu"].startswith("none: no GPU backend: parallaxd was built without CUDA"), s
    elif HAS_GPU:
        assert s["gpu_devices"] > 0 and "CUDA runtime" in s["gpu"], s
        assert s["nccl"] and ("NCCL " + s["nccl"]) in s["gpu"], s
    else:
        # The CUDA runtime's own reason: no driver on a machine without a GPU.
        assert s["gpu_devices"] == 0
        assert s["gpu"].startswith("none: cudaGetDeviceCount: cuda"), s
        assert s["nccl"], s  # the plugin loaded and NCCL answered its version
    # What this daemon offers device allreduces across nodes.
    if HAS_GPU and s["nccl"]:
        assert s["gpu_cross_node"] == "nccl", s
    else:
        assert s["gpu_cross_node"] == "host ring (no usable GPU)", s
    text = pxctl(d, "status", json_output=False).stdout
    assert ("gpu         " + s["gpu"] + " (gpu.mode auto)") in text, text
    assert ("cross-node  " + s["gpu_cross_node"] + " (device allreduces)") in text, text
    assert ("gpu: " + s["gpu"]) in d.log()


def test_gpu_mode_required_refuses_a_node_without_a_gpu_and_says_why(daemons, scratch):
    if BUILT_WITH_CUDA and HAS_GPU:
        d = daemons.start("required", ["--gpu", "required"])
        assert pxctl(d, "status").json["gpu_devices"] > 0
        return
    r = start_refused(scratch, "--gpu", "required")
    assert r.returncode == 1, r
    want = "gpu.mode is required but this node has no usable GPU: "
    assert want in r.stderr, r.stderr
    why = r.stderr.split(want)[1]
    assert ("cudaGetDeviceCount" if BUILT_WITH_CUDA else "built without CUDA") in why, why


def test_gpu_mode_off_and_bad_backends(daemons, scratch):
    # off loads nothing, not even a backend named that is not there.
    d = daemons.start("off", ["--gpu", "off", "--gpu-backend", "/nonexistent/libx.so"])
    s = pxctl(d, "status").json
    assert (s["gpu_mode"], s["gpu_devices"], s["gpu"]) == ("off", 0, "none: gpu.mode is off")

    r = start_refused(scratch, "--gpu", "sometimes")
    assert r.returncode == 2 and "gpu.mode: 'sometimes' is not auto, off or required" in r.stderr

    r = start_refused(scratch, "--gpu-backend", "/nonexistent/libx.so")
    assert r.returncode == 1, r
    assert "gpu.backend: cannot load the GPU backend /nonexistent/libx.so: " in r.stderr, r.stderr

    # A shared object that is not a parallax plugin: libm, which parallaxd has loaded already
    # (a library new to the process, such as libparallax, would leave the allocations of its
    # constructors to LeakSanitizer in the sanitizer build: the handle is never closed).
    lib = [line.split("=>")[1].split()[0] for line in
           subprocess.run(["ldd", PARALLAXD], capture_output=True, text=True,
                          check=True).stdout.splitlines() if "libm.so" in line][0]
    r = start_refused(scratch, "--gpu-backend", lib)
    assert r.returncode == 1, r
    assert ("the GPU backend %s has no px_gpu_backend_create (not a parallax plugin)" % lib
            in r.stderr), r.stderr


def test_parallaxd_links_neither_cuda_nor_nccl():
    libs = needed(PARALLAXD)
    assert not [n for n in libs if "cuda" in n or "nccl" in n], libs
    plugin = os.path.join(os.path.dirname(PARALLAXD), "libparallax_gpu.so")
    if not BUILT_WITH_CUDA:
        assert not os.path.exists(plugin)
        return
    libs = needed(plugin)
    # The runtime and NCCL; never the driver (libcuda) directly.
    assert [n for n in libs if n.startswith("libcudart.so")], libs
    assert [n for n in libs if n.startswith("libnccl.so")], libs
    assert not [n for n in libs if n.startswith("libcuda.so")], libs
    exported = subprocess.run(["nm", "-D", "--defined-only", plugin], capture_output=True,
                              text=True, check=True).stdout.split("\n")
    functions = [line.split()[-1] for line in exported if " T " in line]
    assert functions == ["px_gpu_backend_create"], functions
