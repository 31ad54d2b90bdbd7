#!/usr/bin/env bash
# Set everything up (see scripts/env.sh) and run the test suite. Extra arguments go to pytest.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$PRISM_ROOT"
# vLLM on CPU: its KV-cache memory check sees one NUMA node, so give the cache an explicit size.
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
exec python -m pytest -q "$@"
