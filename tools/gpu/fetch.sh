#!/usr/bin/env bash
# Fetches the Debian packages of tools/gpu/packages.txt into .gpu/debs, for a GPU
# machine that reaches no package registry. Run it where apt works, copy .gpu/
# into the repository on the GPU machine, and run tools/gpu/run.sh there.
set -euo pipefail
cd "$(dirname "$0")/../.."
mapfile -t packages < <(grep -v '^\s*#' tools/gpu/packages.txt | grep -v '^\s*$')
mkdir -p .gpu/debs
rm -f .gpu/debs/*.deb
sudo=""
if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
$sudo apt-get update -q >/dev/null
# apt-get download writes into the working directory, as the _apt user when it can.
(cd .gpu/debs && apt-get download -q "${packages[@]}" 2>&1 | grep -v "unsandboxed" || true)
shopt -s nullglob
debs=(.gpu/debs/*.deb)
count=${#debs[@]}
if [[ $count -ne ${#packages[@]} ]]; then
  echo "fetch: got $count of ${#packages[@]} packages" >&2
  exit 1
fi
echo "fetch: ${count} packages, $(du -sh .gpu/debs | cut -f1), in .gpu/debs"
