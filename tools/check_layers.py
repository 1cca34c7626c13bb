#!/usr/bin/env python3
"""Checks the layering of the runtime and of the SDK: which directory of
runtime/src (runtime/CMakeLists.txt draws the layers) and of sdk/src may
include which, that the public headers in runtime/include/trainrun and
sdk/include/train include nothing internal, and that no files include each
other in a loop. Prints each violation; exits 1 if there is any.

    tools/check_layers.py [PROJECT_ROOT]
"""
import pathlib
import re
import sys

CORE = {"common", "protocol", "transfer", "plugin", "storage"}
# What each directory may include from runtime/src, besides itself.
ALLOWED = {
    "common": set(),
    "protocol": {"common"},
    "plugin": {"common"},
    "transfer": {"common", "protocol"},
    "storage": {"common", "protocol", "transfer"},
    "tensorboard": set(),
    "controller": CORE | {"tensorboard"},
    "worker": CORE,
    "agent": CORE,
    "tune": CORE,
    "api": CORE | {"controller", "tune"},
    "cli": CORE | {"api", "tune"},
}
# The worker executable's main is the one file of cli/ that reaches the worker
# and the agent, and the in-process worker module's the one besides it that
# reaches the worker.
ALLOWED_FILES = {
    "cli/worker_main.cpp": CORE | {"worker", "agent"},
    "cli/in_process_main.cpp": CORE | {"worker"},
}
# The SDK: core/ is the plugin's side of the host table (context, config,
# report, checkpoints, the run's small collectives); DDP, data, mixed
# precision, optimizers and the captured step build on it and not on each
# other; the trainer builds on all of them.
SDK_ALLOWED = {
    "core": set(),
    "ddp": {"core"},
    "data": {"core"},
    "amp": {"core"},
    "optim": {"core"},
    "capture": {"core"},
    "trainer": {"core", "ddp", "data", "amp", "optim", "capture"},
}
# report() checks the prepared models' replicas before its barrier; a survivor
# sends a replacement the prepared models after the SDK's state.
SDK_ALLOWED_FILES = {"core/report.cpp": {"ddp"}, "core/catch_up.cpp": {"ddp"},
                     # it readies the reducers for a capture, and resets them after one failed
                     "capture/captured_step.cpp": {"core", "ddp"}}
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)


def check_tree(src, public, prefix, allowed_dirs, allowed_files, problems):
    """Adds the include graph of one tree (src/ and its public headers) to a
    new graph, noting each include its layers do not allow."""
    graph = {}
    for path in sorted(src.rglob("*.[ch]*")) + sorted(public.glob("*.h")):
        text = path.read_text()
        rel = path.relative_to(src) if src in path.parents else None
        node = str(rel) if rel else prefix + path.name
        graph[node] = []
        for quote, target in INCLUDE.findall(text):
            if quote == "<" and target.startswith(prefix):
                graph[node].append(target)
                continue
            if quote != '"':
                continue
            if rel is None:
                problems.append(f"{path}: public header includes internal \"{target}\"")
                continue
            layer, _, _ = target.partition("/")
            own = rel.parts[0]
            allowed = allowed_files.get(str(rel), allowed_dirs.get(own, set()))
            if (src / target).exists():
                graph[node].append(target)
                if own not in allowed_dirs:
                    problems.append(f"{src.relative_to(src.parents[1])}/{rel}: {own}/ is in no layer")
                elif layer != own and layer not in allowed:
                    problems.append(
                        f"{src.relative_to(src.parents[1])}/{rel}: {own}/ may not include \"{target}\"")
    # Loops: a depth-first search over the include graph.
    state = {}

    def visit(node, stack):
        state[node] = "open"
        for nxt in graph.get(node, []):
            if state.get(nxt) == "open":
                loop = stack[stack.index(nxt):] + [nxt] if nxt in stack else [node, nxt]
                problems.append("include loop: " + " -> ".join(loop))
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for node in graph:
        if node not in state:
            visit(node, [node])
    return graph


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    problems = []
    graph = check_tree(root / "runtime" / "src", root / "runtime" / "include" / "trainrun",
                       "trainrun/", ALLOWED, ALLOWED_FILES, problems)
    graph.update(check_tree(root / "sdk" / "src", root / "sdk" / "include" / "train", "train/",
                            SDK_ALLOWED, SDK_ALLOWED_FILES, problems))
    for p in problems:
        print(p)
    print(f"{len(graph)} files checked, {len(problems)} layering problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
