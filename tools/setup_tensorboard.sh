#!/usr/bin/env bash
# Installs TensorBoard in a virtual environment of its own, for the test that
# reads a run's event files with TensorBoard's own reader (and for looking at
# runs: $venv/bin/tensorboard --logdir <storage_path>).
#
#   tools/setup_tensorboard.sh   # into /opt/trainrun-tensorboard (TRAINRUN_TENSORBOARD_VENV)
#
# The test shows as skipped, saying why, where it is not there.
set -euo pipefail

tensorboard_version=2.18.0
venv=${TRAINRUN_TENSORBOARD_VENV:-/opt/trainrun-tensorboard}
python=${PYTHON:-python3}

if "$venv/bin/python" -c "import tensorboard, sys; sys.exit(tensorboard.__version__ != '$tensorboard_version')" \
     2>/dev/null; then
  echo "setup_tensorboard: tensorboard $tensorboard_version is installed in $venv"
  exit 0
fi

. "$(dirname "$0")/make_venv.sh"
make_venv "$venv"
$sudo "$venv/bin/pip" install -q --disable-pip-version-check --no-cache-dir \
  "tensorboard==$tensorboard_version"
echo "setup_tensorboard: tensorboard $("$venv/bin/python" -c \
  'import tensorboard; print(tensorboard.__version__)') in $venv"
