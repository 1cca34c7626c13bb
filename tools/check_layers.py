#!/usr/bin/env python3
"""Checks the runtime's layering: which directory of runtime/src may include
which (runtime/CMakeLists.txt draws the layers), that the public headers in
runtime/include/trainrun include nothing internal, and that no files include
each other in a loop. Prints each violation; exits 1 if there is any.

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
    "controller": CORE,
    "worker": CORE,
    "agent": CORE,
    "api": CORE | {"controller"},
    "cli": CORE | {"api"},
}
# The worker executable's main is the one file of cli/ that reaches the worker
# and the agent.
ALLOWED_FILES = {"cli/worker_main.cpp": CORE | {"worker", "agent"}}
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    src = root / "runtime" / "src"
    public = root / "runtime" / "include" / "trainrun"
    problems = []
    graph = {}
    for path in sorted(src.rglob("*.[ch]*")) + sorted(public.glob("*.h")):
        text = path.read_text()
        rel = path.relative_to(src) if src in path.parents else None
        node = str(rel) if rel else "trainrun/" + path.name
        graph[node] = []
        for quote, target in INCLUDE.findall(text):
            if quote == "<" and target.startswith("trainrun/"):
                graph[node].append(target)
                continue
            if quote != '"':
                continue
            if rel is None:
                problems.append(f"{path}: public header includes internal \"{target}\"")
                continue
            layer, _, _ = target.partition("/")
            own = rel.parts[0]
            allowed = ALLOWED_FILES.get(str(rel), ALLOWED.get(own, set()))
            if (src / target).exists():
                graph[node].append(target)
                if layer != own and layer not in allowed:
                    problems.append(f"runtime/src/{rel}: {own}/ may not include \"{target}\"")
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
    for p in problems:
        print(p)
    print(f"{len(graph)} files checked, {len(problems)} layering problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
