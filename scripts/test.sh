#!/usr/bin/env bash
# The whole test suite, on a fresh clone: installs what it needs, fetches the real models, runs pytest.
# pytest's exit code 5 (no tests collected) is a failure here, not a pass.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test,tokenizers,numba,notebooks,docs,mkl || exit 1
.venv/bin/refimpl fetch smollm2 >/dev/null || exit 1
.venv/bin/refimpl fetch minilm >/dev/null || exit 1
.venv/bin/refimpl fetch gemma3 >/dev/null || exit 1
# llama.cpp's test-backend-ops, test-llama-archs and ggml-rpc-server (ggml 0.25.3, RPC on), cached outside the repo
bash scripts/build_llamacpp.sh >/dev/null || exit 1
export HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-ci}"
if [ "$#" -gt 0 ]; then
  .venv/bin/python -m pytest "$@"
  rc=$?
  if [ "$rc" -eq 5 ]; then echo "no tests were collected: failing" >&2; exit 1; fi
  exit "$rc"
fi
# The whole suite. tests/cuda runs in numba's CUDA simulator (one Python thread per CUDA thread: GIL-bound,
# one core) in a second pytest process beside the rest, so both cores work; its log follows the main one.
# The simulator process gets one thread of everything; the main one keeps Numba's threads, but BLAS's own
# threads stay off, so that two processes on two cores do not also run idle-spinning BLAS threads (the splits
# refimpl makes over its own threads are unaffected). --durations names the slowest tests in the log.
cuda_log="$(mktemp)"
NUMBA_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 OMP_NUM_THREADS=1 \
  .venv/bin/python -m pytest -p no:cacheprovider --durations=15 tests/cuda >"$cuda_log" 2>&1 &
cuda_pid=$!
OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 .venv/bin/python -m pytest --durations=40 --ignore=tests/cuda
rc=$?
wait "$cuda_pid"
cuda_rc=$?
echo
echo "================ tests/cuda (CUDA kernels in numba's simulator, run beside the rest) ================"
cat "$cuda_log"
rm -f "$cuda_log"
for r in "$rc" "$cuda_rc"; do
  if [ "$r" -eq 5 ]; then echo "no tests were collected: failing" >&2; exit 1; fi
done
if [ "$rc" -ne 0 ]; then exit "$rc"; fi
exit "$cuda_rc"
