#!/usr/bin/env bash
# The whole test suite, on a fresh clone: installs what it needs, fetches the real models, runs pytest.
# pytest's exit code 5 (no tests collected) is a failure here, not a pass.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test,tokenizers,numba,notebooks,docs || exit 1
.venv/bin/refimpl fetch smollm2 >/dev/null || exit 1
.venv/bin/refimpl fetch minilm >/dev/null || exit 1
export HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-ci}"
.venv/bin/python -m pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then echo "no tests were collected: failing" >&2; exit 1; fi
exit "$rc"
