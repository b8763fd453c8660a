#!/usr/bin/env bash
# The main job: generate text with the real SmolLM2-135M-Instruct GGUF through refimpl.
#   bash scripts/main.sh                       # continues "Once upon a time"
#   bash scripts/main.sh -p "The capital of France is" -n 32
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh tokenizers,numba
.venv/bin/refimpl fetch smollm2 >/dev/null
if [ "$#" -eq 0 ]; then set -- -p "Once upon a time" -n 48; fi
# A fresh clone has no Numba cache yet: the kernels a generation uses are compiled here, once, said in one line,
# so that the generation below starts at full speed (refimpl/kernels/__pycache__ keeps them for every later run)
if ! ls refimpl/kernels/__pycache__/*.nbi >/dev/null 2>&1; then
  echo "compiling refimpl's Numba kernels for SmolLM2 (first run only, seconds)" >&2
  .venv/bin/refimpl generate -p "Once upon a time" -n 2 >/dev/null 2>&1 || true     # an error shows below
fi
exec .venv/bin/refimpl generate "$@"
