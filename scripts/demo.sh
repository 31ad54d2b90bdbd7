#!/usr/bin/env bash
# Set everything up (see scripts/env.sh), build the embedded tiny Bonsai-architecture model
# and inspect it. Given a path to a GGUF file, inspect that file instead.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$PRISM_ROOT"
model="${1:-}"
if [ -z "$model" ]; then
  model="$VENV_ROOT/tiny-bonsai-pq2_0.gguf"
  vllm-prism make-tiny "$model" --format pq2_0
fi
vllm-prism inspect "$model"
