#!/usr/bin/env bash
# The main job: generate text with the real SmolLM2-135M-Instruct GGUF through refimpl.
#   bash scripts/main.sh                       # continues "Once upon a time"
#   bash scripts/main.sh -p "The capital of France is" -n 32
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh tokenizers,numba
.venv/bin/refimpl fetch smollm2 >/dev/null
if [ "$#" -eq 0 ]; then set -- -p "Once upon a time" -n 48; fi
exec .venv/bin/refimpl generate "$@"
