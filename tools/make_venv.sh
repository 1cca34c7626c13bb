# Sourced by tools/setup_*.sh: make_venv VENV makes a Python virtual environment
# at VENV with $python (default python3), installing python3-venv first where
# that Python cannot make one. Sets $sudo ("sudo" when not root).
sudo=""
if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi

make_venv() {
  local python=${python:-python3}
  if ! "$python" -m venv --help >/dev/null 2>&1 || ! "$python" -c "import ensurepip" 2>/dev/null; then
    $sudo apt-get update -q
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends python3-venv
    python=/usr/bin/python3
  fi
  $sudo "$python" -m venv "$1"
}
