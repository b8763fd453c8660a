#!/usr/bin/env bash
# The main job: fetch the real SmolLM2-135M GGUF and run refimpl on it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/refimpl fetch smollm2 >/dev/null
exec .venv/bin/refimpl demo "$@"
