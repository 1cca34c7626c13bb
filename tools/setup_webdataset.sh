#!/usr/bin/env bash
# Installs Python's webdataset package, which the shard tests use to check that
# trainrun reads its shards and it reads trainrun's, in a virtual environment
# of its own.
#
#   tools/setup_webdataset.sh        # into /opt/trainrun-wds (TRAINRUN_WDS_VENV)
#
# The tests look for $TRAINRUN_WDS_VENV/bin/python, and show as skipped, saying
# why, where it is not there.
set -euo pipefail

webdataset_version=1.0.2
numpy_version=1.26.4
venv=${TRAINRUN_WDS_VENV:-/opt/trainrun-wds}
python=${PYTHON:-python3}

if "$venv/bin/python" -c "import webdataset, numpy, sys; from importlib.metadata import version; \
sys.exit(version('webdataset') != '$webdataset_version')" 2>/dev/null; then
  echo "setup_webdataset: webdataset $webdataset_version is installed in $venv"
  exit 0
fi

. "$(dirname "$0")/make_venv.sh"
make_venv "$venv"
$sudo "$venv/bin/pip" install -q --disable-pip-version-check --no-cache-dir \
  "webdataset==$webdataset_version" "numpy==$numpy_version"
echo "setup_webdataset: webdataset $webdataset_version in $venv"
