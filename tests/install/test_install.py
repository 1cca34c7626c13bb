#!/usr/bin/env python3
"""The installed package, as a user's project meets it.

    tests/install/test_install.py SOURCE_DIR BUILD_DIR

Installs BUILD_DIR into a temporary prefix (`cmake --install`), then configures,
builds and runs examples/quickstart (a plugin: find_package(trainrun)), builds
examples/imagenet (find_package(trainrun COMPONENTS sdk images)), and
examples/embedding (a host program: find_package(trainrun COMPONENTS runtime))
out of tree with only CMAKE_PREFIX_PATH set, and runs them with a PATH that
holds neither the build nor the prefix: the installed `trainrun` finds its
library through its RPATH, and the library finds trainrun-worker in the
prefix. The embedding example is also built against BUILD_DIR itself (the
build-tree export). Where BUILD_DIR's LibTorch is not the system's and the
system has one (pip's 2.x beside Debian's 1.13), the installed plugin links
BUILD_DIR's LibTorch alone, and a plugin project told to use the system's
(Torch_DIR) fails to configure, naming both.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile


def run(cmd, env=None, cwd=None):
    result = subprocess.run(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, timeout=600)
    if result.returncode != 0:
        raise SystemExit(f"FAIL: {' '.join(cmd)} exited {result.returncode}\n"
                         f"{result.stdout[-6000:]}")
    return result.stdout


def build_example(source, name, prefix_path, into):
    out = os.path.join(into, name)
    run(["cmake", "-S", os.path.join(source, "examples", name), "-B", out, "-G", "Ninja",
         "-DCMAKE_BUILD_TYPE=Release", f"-DCMAKE_PREFIX_PATH={prefix_path}"])
    run(["cmake", "--build", out])
    return out


def cache_value(build, name):
    with open(os.path.join(build, "CMakeCache.txt")) as f:
        for line in f:
            if line.startswith(name + ":"):
                return line.split("=", 1)[1].strip()
    return ""


def check_other_torch_refused(source, prefix, build, tmp):
    """find_package(trainrun) in a project whose Torch_DIR is another LibTorch."""
    torch_dir = os.path.realpath(cache_value(build, "Torch_DIR"))
    system = "/usr/lib/x86_64-linux-gnu/cmake/Torch"
    if torch_dir.startswith("/usr/") or not os.path.isdir(system):
        print("other LibTorch: not checked (this build uses the system's, or there is no other)")
        return
    result = subprocess.run(
        ["cmake", "-S", os.path.join(source, "examples", "quickstart"), "-B",
         os.path.join(tmp, "other-torch"), "-G", "Ninja", f"-DCMAKE_PREFIX_PATH={prefix}",
         f"-DTorch_DIR={system}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    if result.returncode == 0 or "trainrun was built with LibTorch" not in result.stdout:
        raise SystemExit("FAIL: a plugin project that found another LibTorch first was not "
                         f"refused at configure time:\n{result.stdout[-4000:]}")
    print("other LibTorch: refused at configure time, naming both")


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    source, build = (os.path.abspath(p) for p in sys.argv[1:])
    tmp = tempfile.mkdtemp(prefix="trainrun-install-")
    try:
        prefix = os.path.join(tmp, "prefix")
        run(["cmake", "--install", build, "--prefix", prefix])
        for path in ("bin/trainrun", "bin/trainrun-worker", "lib/libtrainrun.so",
                     "include/trainrun/trainer.h", "include/train/train.h",
                     "lib/cmake/trainrun/trainrunConfig.cmake",
                     "lib/cmake/trainrun/trainrunRuntimeTargets.cmake"):
            if not os.path.exists(os.path.join(prefix, path)):
                raise SystemExit(f"FAIL: the install lacks {path}")
        # The library exports the API and nothing else (api/exports.map).
        symbols = run(["nm", "-DC", "--defined-only", os.path.join(prefix, "lib", "libtrainrun.so")])
        for line in symbols.splitlines():
            name = line.split(" ", 2)[2]
            if "trainrun::" not in name or "run_directory" in name or "Controller" in name:
                raise SystemExit(f"FAIL: libtrainrun.so exports {name}")
        for wanted in ("trainrun::Trainer::fit()", "trainrun::Tuner::fit()",
                       "trainrun::Domain::parse(", "trainrun::load_experiment(",
                       "trainrun::to_string(trainrun::TrialStatus)"):
            if wanted not in symbols:
                raise SystemExit(f"FAIL: libtrainrun.so does not export {wanted}\n{symbols}")
        check_other_torch_refused(source, prefix, build, tmp)
        quickstart = build_example(source, "quickstart", prefix, tmp)
        # Only the LibTorch trainrun was built with (pip's TorchConfig beside
        # Debian's once took the latter's libraries).
        torch_lib = os.path.realpath(os.path.join(cache_value(build, "Torch_DIR"),
                                                  "..", "..", "..", "lib"))
        needed = run(["ldd", os.path.join(quickstart, "libquickstart.so")])
        for line in needed.splitlines():
            if ("libtorch" in line or "libc10" in line) and "=>" in line:
                path = os.path.realpath(line.split("=>")[1].split("(")[0].strip())
                if not cache_value(build, "Torch_DIR").startswith("/usr/") and \
                        not path.startswith(torch_lib + os.sep):
                    raise SystemExit(f"FAIL: the plugin links another LibTorch: {line.strip()}")
        # libstdc++ ahead of LibTorch, from the installed package too
        # (cmake/TrainrunLinkOrder.cmake: LibTorch exports a std::filesystem).
        dynamic = run(["readelf", "-d", os.path.join(quickstart, "libquickstart.so")])
        order = [n for n in re.findall(r"Shared library: \[([^\]]+)\]", dynamic)
                 if n.startswith(("libstdc++", "libtorch", "libc10"))]
        if not order or not order[0].startswith("libstdc++"):
            raise SystemExit(f"FAIL: the installed package's plugin loads {order} in that order")
        # find_package(trainrun COMPONENTS sdk images): trainrun::images and its libraries
        # from the package (built on one line: the component is the same on both).
        if cache_value(build, "Torch_DIR").startswith("/usr/"):
            imagenet = build_example(source, "imagenet", prefix, tmp)
            if not os.path.exists(os.path.join(imagenet, "libimagenet.so")):
                raise SystemExit("FAIL: the ImageNet example built out of tree made no plugin")
        embedding = build_example(source, "embedding", prefix, tmp)
        plugin = os.path.join(quickstart, "libquickstart.so")
        # Nothing of trainrun on PATH: each finds the other through the prefix.
        env = {"PATH": "/usr/bin:/bin", "HOME": tmp,
               "TRAINRUN_CACHE_DIR": os.path.join(tmp, "cache")}
        out = run([os.path.join(prefix, "bin", "trainrun"), "--plugin", plugin, "-n", "2",
                   "--config", "steps=5", "--storage-path", os.path.join(tmp, "results"),
                   "--name", "installed"], env=env, cwd=tmp)
        if "run finished: 5 reports" not in out:
            raise SystemExit(f"FAIL: the installed trainrun did not finish 5 reports:\n{out}")
        # The in-process worker module, found from the installed trainrun.
        out = run([os.path.join(prefix, "bin", "trainrun"), "--plugin", plugin, "--local",
                   "--config", "steps=3", "--storage-path", os.path.join(tmp, "results"),
                   "--name", "installed-local"], env=env, cwd=tmp)
        if "run finished: 3 reports" not in out or "in this process" not in out:
            raise SystemExit(f"FAIL: the installed trainrun --local did not finish 3 reports:\n{out}")
        out = run([os.path.join(embedding, "embedding"), plugin, os.path.join(tmp, "results")],
                  env=env, cwd=tmp)
        if "iteration 10:" not in out or "finished: 10 reports" not in out:
            raise SystemExit(f"FAIL: the embedding example did not report 10 times:\n{out}")
        # From the build directory, without installing.
        from_build = build_example(source, "embedding", build, os.path.join(tmp, "build-tree"))
        out = run([os.path.join(from_build, "embedding"), plugin,
                   os.path.join(tmp, "results-build-tree")], env=env, cwd=tmp)
        if "finished: 10 reports" not in out:
            raise SystemExit(f"FAIL: the build-tree embedding did not finish:\n{out}")
        print("passed: installed, built out of tree, and run from the prefix and the build tree")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
