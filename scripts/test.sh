#!/usr/bin/env bash
# The whole test suite, on a fresh clone: installs what it needs, fetches the real models, runs pytest.
# pytest's exit code 5 (no tests collected) is a failure here, not a pass.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test,tokenizers,numba,notebooks,docs,mkl || exit 1
.venv/bin/refimpl fetch smollm2 >/dev/null || exit 1
.venv/bin/refimpl fetch minilm >/dev/null || exit 1
.venv/bin/refimpl fetch gemma3 >/dev/null || exit 1
# Debian's chromium, the real browser tests/test_docs.py opens the built site in (installed when absent and this
# runs as root with apt-get; otherwise that test says how to install it)
if ! command -v chromium >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  mkdir -p build
  { apt-get install -y --no-install-recommends chromium || { apt-get update && apt-get install -y --no-install-recommends chromium; }; } \
    >build/apt-chromium.log 2>&1 || echo "scripts/test.sh: apt-get install chromium failed (build/apt-chromium.log)" >&2
fi
# llama.cpp's test-backend-ops, test-llama-archs and ggml-rpc-server (ggml 0.25.3, RPC on), cached outside the repo
bash scripts/build_llamacpp.sh >/dev/null || exit 1
# ci: derandomized, the same examples on every run of a commit (tests/_profiles.py; explore draws new ones)
export HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-ci}"
if [ "$#" -gt 0 ]; then
  .venv/bin/python -m pytest "$@"
  rc=$?
  if [ "$rc" -eq 5 ]; then echo "no tests were collected: failing" >&2; exit 1; fi
  exit "$rc"
fi
# The whole suite in two lanes, one per core. Lane 2: tests/cuda in numba's CUDA simulator (one Python
# thread per CUDA thread: GIL-bound, one core), then the per-op hypothesis comparison against live ggml
# (tests/oracle/test_ops.py::test_op_matches_ggml: one forked ggml per example, one core). Lane 1:
# everything else. Measured on this 2-core machine, both lanes at once: lane 1 29.5 min; lane 2 tests/cuda
# 14.7 min, then the per-op comparison 6.2 min at 80 examples an op (CI runs 100: ~8 min; inside lane 1's
# long-lived process the same comparison took ~26 min, its forks of a large parent). Lane 2 gets one
# thread of everything; lane 1 keeps Numba's threads, but BLAS's own threads stay off, so that two
# processes on two cores do not also run idle-spinning BLAS threads (the splits refimpl makes over its
# own threads are unaffected).
# --durations names the slowest tests in the log.
# test-backend-ops' subset in ggml numerics (~4 min) runs in lane 2 too: lane 1 measured 38.7 min on
# 2026-12-03 with it, lane 2 22 min without.
# The judge's CI subset (tests/rpc/test_conformance.py, ~1 min) runs there as well.
ggml_tbo="tests/rpc/test_backend_ops.py::test_backend_ops_subset[ggml]"
judge="tests/rpc/test_conformance.py"
lane2_log="$(mktemp)"
(
  export NUMBA_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 OMP_NUM_THREADS=1
  .venv/bin/python -m pytest -p no:cacheprovider --durations=15 tests/cuda
  r1=$?
  echo
  echo "================ tests/oracle/test_ops.py::test_op_matches_ggml (lane 2) ================"
  .venv/bin/python -m pytest -p no:cacheprovider --durations=15 tests/oracle/test_ops.py -k test_op_matches_ggml
  r2=$?
  echo
  echo "================ $ggml_tbo, $judge (lane 2) ================"
  .venv/bin/python -m pytest -p no:cacheprovider --durations=5 -s "$ggml_tbo" "$judge"
  r3=$?
  for r in "$r1" "$r2" "$r3"; do
    if [ "$r" -eq 5 ]; then echo "no tests were collected: failing"; exit 1; fi
    if [ "$r" -ne 0 ]; then exit "$r"; fi
  done
  exit 0
) >"$lane2_log" 2>&1 &
lane2_pid=$!
OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 .venv/bin/python -m pytest --durations=40 --ignore=tests/cuda \
  --deselect tests/oracle/test_ops.py::test_op_matches_ggml --deselect "$ggml_tbo" --ignore "$judge"
rc=$?
wait "$lane2_pid"
lane2_rc=$?
echo
echo "================ lane 2: tests/cuda (numba's CUDA simulator), test_op_matches_ggml, $ggml_tbo, $judge ================"
cat "$lane2_log"
rm -f "$lane2_log"
if [ "$rc" -eq 5 ]; then echo "no tests were collected: failing" >&2; exit 1; fi
if [ "$rc" -ne 0 ]; then exit "$rc"; fi
exit "$lane2_rc"
