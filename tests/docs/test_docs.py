#!/usr/bin/env python3
"""Docs that cannot drift from the code they describe:

- every flag that `trainrun --help` and each subcommand's `--help` list is in
  docs/cli.md, in that command's section, and every flag documented there
  exists in that command's `--help`; every subcommand has a section;
- every flag given to trainrun on a command line in README.md, docs/ and the
  examples' manifests is one that command takes;
- every repository path named in README.md, docs/ and the examples' READMEs
  exists, and every relative link (and its #anchor) leads somewhere;
- every page in docs/ is reachable from the README, and the README stays a
  first contact (at most README_MAX_LINES lines), and its tour's train function
  is examples/tour/tour.cpp's code, which test_tour.py runs.

usage: test_docs.py TRAINRUN REPO_ROOT
"""
import glob
import os
import re
import subprocess
import sys

README_MAX_LINES = 350  # a ten-minute read: the tour and the Ray Train table; depth in docs/
TOP_DIRS = r"(?:\.ci|cmake|docs|examples|plugins|runtime|sdk|tests|tools)"
# A path in the repository, as prose and code blocks write it: not a part of
# a longer path (build/tests/... is a build output), no placeholders.
REPO_PATH = re.compile(r"(?<![\w./~-])(" + TOP_DIRS + r"/[\w./-]*(?:\{[\w.,/-]+\}[\w./-]*)?)")
FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")

problems = []


def help_text(trainrun, command):
    out = subprocess.run([trainrun, *command, "--help"], capture_output=True, text=True,
                         timeout=60)
    if out.returncode != 0:
        sys.exit(f"trainrun {' '.join(command)} --help exited {out.returncode}: {out.stderr}")
    return out.stdout


def help_flags(text):
    """The flags of CLI11's option lines: '  -n,--num-workers TEXT  ...'."""
    flags = set()
    for line in text.splitlines():
        match = re.match(r"^  (-[\w-]+(?:,-[\w-]+)*)", line)
        if match:
            flags.update(match.group(1).split(","))
    return flags


def subcommands(text):
    names, listing = [], False
    for line in text.splitlines():
        if line.startswith("Subcommands:"):
            listing = True
        elif listing and re.match(r"^  [a-z]", line):
            names.append(line.split()[0])
        elif listing and line and not line.startswith(" "):
            listing = False
    return names


def documented_flags(cli_md):
    """{command: flags} from docs/cli.md: its sections '## `trainrun worker`' and
    the first cell of each table row in them."""
    sections, current = {}, None
    for line in cli_md.splitlines():
        heading = re.match(r"^## `(trainrun[^`]*)`", line)
        if heading:
            current = heading.group(1)
            sections[current] = set()
        elif line.startswith("##"):
            current = None
        elif current and line.startswith("|") and not re.match(r"^\|[\s:|-]+$", line):
            first_cell = re.split(r"(?<!\\)\|", line)[1]
            for code in re.findall(r"`([^`]+)`", first_cell):
                sections[current].update(FLAG.findall(code))
    return sections


def check_cli(trainrun, root):
    with open(os.path.join(root, "docs", "cli.md")) as f:
        documented = documented_flags(f.read())
    top = help_text(trainrun, [])
    commands = [[]] + [[name] for name in subcommands(top)]
    if ["worker"] not in commands:
        problems.append("trainrun --help does not list the worker subcommand")
    for command in commands:
        name = " ".join(["trainrun", *command])
        actual = help_flags(help_text(trainrun, command))
        if name not in documented:
            problems.append(f"docs/cli.md has no section '## `{name}`'")
            continue
        for flag in sorted(actual - documented[name]):
            problems.append(f"{name} {flag}: in --help, missing from docs/cli.md")
        for flag in sorted(documented[name] - actual):
            problems.append(f"{name} {flag}: in docs/cli.md, not in --help")
    for name in sorted(set(documented) - {" ".join(["trainrun", *c]) for c in commands}):
        problems.append(f"docs/cli.md documents '{name}', which trainrun --help does not list")
    flags = {" ".join(c): help_flags(help_text(trainrun, c)) for c in commands}
    # `trainrun tune` takes every flag of a run too (CLI11's fallthrough).
    if "tune" in flags:
        flags["tune"] |= flags[""]
    check_command_lines(root, flags)


def check_command_lines(root, flags):
    """Every flag given to trainrun on a command line in README.md, docs/ and the
    examples' manifests is one that trainrun (or its subcommand) takes."""
    pages = [os.path.join(root, "README.md"), *glob.glob(os.path.join(root, "docs", "*.md")),
             *glob.glob(os.path.join(root, "examples", "*", "*.md")),
             *glob.glob(os.path.join(root, "examples", "*", "*.yaml")),
             *glob.glob(os.path.join(root, "examples", "*", "*.sbatch"))]
    subcommand = "|".join(re.escape(name) for name in flags if name)
    for page in sorted(pages):
        rel = os.path.relpath(page, root)
        with open(page) as f:
            text = f.read().replace("\\\n", " ")  # a shell line continued
        # A YAML command list becomes one line: "- trainrun\n- worker\n- --connect=..."
        if page.endswith(".yaml"):
            text = " ".join(re.findall(r"^\s*- (\S.*)$", text, re.M))
        for line in text.splitlines():
            for match in re.finditer(rf"(?:^|[\s`/])trainrun(?: ({subcommand}))?\s", line):
                command = match.group(1) or ""
                rest = re.split(r"&&|\||;|`|\s#", line[match.end():])[0]  # to a comment
                for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", rest):
                    if flag != "--help" and flag not in flags.get(command, set()):
                        problems.append(f"{rel}: `trainrun {command} ... {flag}`: "
                                        f"no such flag".replace("  ", " "))


def anchors(markdown):
    """GitHub's anchors for a page's headings."""
    found = set()
    for heading in re.findall(r"^#+ (.+)$", markdown, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        base, n = slug, 1
        while slug in found:
            slug, n = f"{base}-{n}", n + 1
        found.add(slug)
    return found


def expand(path):
    """sdk/src/ddp/reducer.{h,cpp}: each of the paths it names."""
    braces = re.search(r"\{([^}]*)\}", path)
    if not braces:
        return [path.rstrip("/.")]
    return [p for choice in braces.group(1).split(",")
            for p in expand(path[:braces.start()] + choice + path[braces.end():])]


def check_paths(root):
    pages = [os.path.join(root, "README.md")] + sorted(
        glob.glob(os.path.join(root, "docs", "*.md")) +
        glob.glob(os.path.join(root, "examples", "*", "README.md")))
    for page in pages:
        rel = os.path.relpath(page, root)
        with open(page) as f:
            text = f.read()
        for named in sorted(set(REPO_PATH.findall(text))):
            for path in expand(named):
                if not os.path.exists(os.path.join(root, path)):
                    problems.append(f"{rel} names {path}, which does not exist")
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", target):
                continue  # https:, mailto:
            file_part, _, anchor = target.partition("#")
            linked = os.path.normpath(os.path.join(os.path.dirname(page), file_part)) \
                if file_part else page
            if not os.path.exists(linked):
                problems.append(f"{rel} links to {target}, which does not exist")
            elif anchor and linked.endswith(".md"):
                with open(linked) as f:
                    if anchor not in anchors(f.read()):
                        problems.append(f"{rel} links to {target}: no such heading")


def check_readme(root):
    with open(os.path.join(root, "README.md")) as f:
        readme = f.read()
    lines = readme.count("\n")
    if lines > README_MAX_LINES:
        problems.append(f"README.md has {lines} lines: more than {README_MAX_LINES}; move "
                        "depth into docs/")
    for page in sorted(glob.glob(os.path.join(root, "docs", "*.md"))):
        name = os.path.basename(page)
        if f"(docs/{name}" not in readme:
            problems.append(f"README.md does not link docs/{name}")
    # The tour's train function is examples/tour/tour.cpp, which a test runs.
    tour = re.search(r"```cpp\n(.*?)```", readme, re.S)
    with open(os.path.join(root, "examples", "tour", "tour.cpp")) as f:
        if tour is None or tour.group(1) not in f.read():
            problems.append("README.md's first C++ block is not examples/tour/tour.cpp's code")


def main():
    trainrun, root = sys.argv[1], sys.argv[2]
    check_cli(trainrun, root)
    check_paths(root)
    check_readme(root)
    if problems:
        print("\n".join(problems))
        sys.exit(f"{len(problems)} place(s) where the docs and the code disagree")
    print("docs: every flag, path and link matches the code")


if __name__ == "__main__":
    main()
