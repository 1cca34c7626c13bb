#!/usr/bin/env bash
# Installs the Debian 12 packages trainrun needs.
#   tools/setup.sh           to build trainrun and run jobs (the FashionMNIST one included)
#   tools/setup.sh --tests   and to build and pass the tests (with tools/setup_s3.sh:
#                            the S3 server and boto3 the object-storage tests use;
#                            tools/setup_tensorboard.sh: TensorBoard's reader;
#                            tools/setup_webdataset.sh: Python's webdataset)
#   tools/setup.sh --bench   and what the benchmarks compare against
# Uses sudo when not root.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libtorch-dev libgloo-dev
  cppzmq-dev libmsgpack-cxx-dev libboost-dev libboost-stacktrace1.74-dev libdw-dev
  # TensorBoard event files: protobuf-lite and its compiler.
  libprotobuf-dev protobuf-compiler libspdlog-dev
  libcli11-dev nlohmann-json3-dev libssl-dev libsodium-dev zlib1g-dev
  # The replica check's hash (XXH3, inlined: plugins link no library of it).
  libxxhash-dev
  # Object storage: libcurl signs S3 requests (SigV4), pugixml reads S3's XML.
  libcurl4-openssl-dev libpugixml-dev
  # report.html's charts (inlined at build time).
  libjs-chart.js
  # trainrun::images: libjpeg-turbo (partial, scaled decode), libspng, OpenCV's resizer.
  libjpeg62-turbo-dev libspng-dev libopencv-imgproc-dev
  # The FashionMNIST plugin's data.
  dataset-fashion-mnist
)
test_packages=(
  python3 doctest-dev
  ccache  # .ci/run's second LibTorch line reuses the first's objects
  # The test that renders report.html in a headless browser.
  chromium fonts-liberation
  # The launcher tests: a one-node Slurm cluster, network namespaces.
  slurm-wlm munge iproute2 util-linux
  # PyTorch 1.13 (the same LibTorch): the DDP oracle test; torchvision's crops.
  python3-torch python3-torchvision
  # tools/setup_s3.sh's and tools/setup_tensorboard.sh's virtual environments.
  python3-venv
  # --local under a debugger.
  gdb
)
bench_packages=(
  python3
  # torchrun + DistributedDataParallel, the baselines.
  python3-torch python3-torchvision
)
s3=0
for option in "$@"; do
  case "$option" in
    --tests) packages+=("${test_packages[@]}"); s3=1 ;;
    --bench) packages+=("${bench_packages[@]}") ;;
    *) echo "usage: tools/setup.sh [--tests] [--bench]" >&2; exit 2 ;;
  esac
done

mapfile -t packages < <(printf '%s\n' "${packages[@]}" | sort -u)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "setup: all ${#packages[@]} packages are installed"
else
  sudo=""
  if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
  echo "setup: installing ${missing[*]}"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
if ((s3)); then
  PYTHON=/usr/bin/python3 "$(dirname "$0")/setup_s3.sh"
  PYTHON=/usr/bin/python3 "$(dirname "$0")/setup_tensorboard.sh"
  PYTHON=/usr/bin/python3 "$(dirname "$0")/setup_webdataset.sh"
fi
