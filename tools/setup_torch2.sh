#!/usr/bin/env bash
# Installs the second LibTorch line trainrun is tested against: PyTorch's pip
# wheel (LibTorch 2.x built with CUDA and NCCL; its headers, libraries and CMake
# package live inside the wheel) in a virtual environment of its own.
#
#   tools/setup_torch2.sh            # into /opt/trainrun-torch (TRAINRUN_TORCH_VENV)
#   cmake -S . -B build-torch2 -G Ninja \
#     -DCMAKE_PREFIX_PATH="$(/opt/trainrun-torch/bin/python -c 'import torch; print(torch.utils.cmake_prefix_path)')"
#
# The wheel's CMake package looks for the CUDA toolkit (nvcc, cudart headers), so
# the toolkit must be installed; no GPU is needed to build or to run the CPU tests.
set -euo pipefail

version=2.15.0  # the tested one; others of 2.6 and later build too
venv=${TRAINRUN_TORCH_VENV:-/opt/trainrun-torch}
python=${PYTHON:-python3}

if "$venv/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$version')" \
     2>/dev/null; then
  echo "setup_torch2: torch $version is installed in $venv"
  exit 0
fi

if ! command -v nvcc >/dev/null && [[ ! -x /usr/local/cuda/bin/nvcc ]]; then
  echo "setup_torch2: no CUDA toolkit (nvcc) here; the pip LibTorch's CMake package needs one" >&2
  exit 1
fi

. "$(dirname "$0")/make_venv.sh"
make_venv "$venv"
echo "setup_torch2: installing torch==$version into $venv (about 6 GB with its CUDA libraries)"
$sudo "$venv/bin/pip" install -q --disable-pip-version-check --no-cache-dir "torch==$version"
"$venv/bin/python" -c "import torch; print('setup_torch2: torch', torch.__version__, \
'CUDA', torch.version.cuda, '->', torch.utils.cmake_prefix_path)"
