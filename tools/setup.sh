#!/usr/bin/env bash
# Installs every Debian 12 package trainrun needs to build, test and run the
# FashionMNIST job. Pass --bench to add what the benchmarks compare against
# (PyTorch and torchvision for torchrun + DistributedDataParallel).
set -euo pipefail

packages=(
  build-essential cmake ninja-build python3
  ccache  # .ci/run's second LibTorch line reuses the first's objects
  libtorch-dev libgloo-dev
  cppzmq-dev libmsgpack-cxx-dev libboost-dev libspdlog-dev
  libcli11-dev nlohmann-json3-dev libssl-dev libsodium-dev pkg-config doctest-dev
  zlib1g-dev dataset-fashion-mnist
  # report.html's charts (inlined at build time).
  libjs-chart.js
  # The test that renders report.html in a headless browser.
  chromium fonts-liberation
  # The launcher tests: a one-node Slurm cluster, network namespaces.
  slurm-wlm munge iproute2 util-linux
  # PyTorch 1.13 (the same LibTorch): the DDP oracle test, and torchrun for the benchmarks.
  python3-torch
)
if [[ "${1:-}" == "--bench" ]]; then
  packages+=(python3-torchvision)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "setup: all ${#packages[@]} packages are installed"
  exit 0
fi

sudo=""
if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
echo "setup: installing ${missing[*]}"
$sudo apt-get update -q
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
