#!/bin/sh
# A real run's TensorBoard event files, read by the tensorboard package's own
# reader (read_events.py): two runs of one name, whose iterations continue.
#
#   check_run.sh TRAINRUN TEST_PLUGIN PYTHON
#
# Exits 77 (CTest's skip) where PYTHON has no tensorboard (tools/setup_tensorboard.sh).
set -eu
trainrun=$1 plugin=$2 python=$3
if ! "$python" -c "import tensorboard" 2>/dev/null; then
  echo "skipped: $python cannot import tensorboard (tools/setup_tensorboard.sh installs it)"
  exit 77
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for steps in 5 3; do
  if ! "$trainrun" --plugin "$plugin" --entry steps -n 2 --name tb --storage-path "$dir" \
      --config steps=$steps --progress-interval 0 >"$dir/out.txt" 2>&1; then
    cat "$dir/out.txt"
    exit 1
  fi
done
ls "$dir/tb"
exec "$python" "$(dirname "$0")/read_events.py" "$dir/tb" step loss --steps 8
