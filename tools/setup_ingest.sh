#!/usr/bin/env bash
# Installs what tools/bench/ingest.py measures trainrun's image loader against,
# in a virtual environment of its own that sees Debian's PyTorch: PyTorch's
# DataLoader over webdataset with torchvision's transforms (python3-torch,
# python3-torchvision, python3-pil), NVIDIA DALI's CPU pipeline (its CUDA 12
# wheel, whose CPU operators run without a GPU or a CUDA driver) and Ray Data
# (with Ray Train, which its iter_torch_batches imports); and the photographs
# the benchmark's shards are cut from (mate-backgrounds).
#
#   tools/setup_ingest.sh        # into /opt/trainrun-ingest (TRAINRUN_INGEST_VENV)
#
# The venv is made by Debian's python3 with --system-site-packages so that its
# PyTorch 1.13 is the one used; numpy stays 1.x for it, and pyarrow is the newest
# that runs with numpy 1.x. The pins match the other benchmarks' environments.
set -euo pipefail

webdataset_version=1.0.2
numpy_version=1.26.4
ray_version=2.60.0
pyarrow_version=25.0.1
dali_version=2.4.0
venv=${TRAINRUN_INGEST_VENV:-/opt/trainrun-ingest}
python=/usr/bin/python3

if [[ -d /usr/share/backgrounds/mate/nature ]] &&
   "$venv/bin/python" -c "import torch, torchvision, PIL, webdataset, nvidia.dali, sys
import ray.data, ray.train
from importlib.metadata import version
sys.exit((version('webdataset'), version('ray'), version('nvidia-dali-cuda120'), version('numpy'))
         != ('$webdataset_version', '$ray_version', '$dali_version', '$numpy_version'))" \
     2>/dev/null; then
  echo "setup_ingest: webdataset $webdataset_version, DALI $dali_version and Ray $ray_version" \
    "are installed in $venv"
  exit 0
fi

. "$(dirname "$0")/make_venv.sh"
missing=()
for package in python3-torch python3-torchvision python3-pil python3-venv mate-backgrounds; do
  if ! dpkg-query -W -f '${Status}' "$package" 2>/dev/null | grep -q "ok installed"; then
    missing+=("$package")
  fi
done
if (( ${#missing[@]} )); then
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
$sudo "$python" -m venv --system-site-packages "$venv"
$sudo "$venv/bin/pip" install -q --disable-pip-version-check --no-cache-dir \
  "webdataset==$webdataset_version" "numpy==$numpy_version" "ray[data,train]==$ray_version" \
  "pyarrow==$pyarrow_version" "nvidia-dali-cuda120==$dali_version"
echo "setup_ingest: $("$venv/bin/python" -c "import torch, torchvision, nvidia.dali, ray
print('torch', torch.__version__, 'torchvision', torchvision.__version__, 'DALI',
      nvidia.dali.__version__, 'Ray', ray.__version__, end='')") in $venv"
