#!/usr/bin/env bash
# Create .venv and install refimpl with the extras named in $1 (e.g. "test"), idempotently.
# ggml-python (the golden oracle) and llama-cpp-python (for refimpl compare) are built from source portably:
# AVX2/FMA/F16C, no AVX-512, no AMX, no native flags -- the profile every golden value here was produced with.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
py="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$py" -m venv .venv
  .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
fi
stamp=".venv/.refimpl-installed-$extras-$(sha1sum pyproject.toml | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  export CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
  spec="."; [ -n "$extras" ] && spec=".[$extras]"
  case ",$extras," in *,test,*) need_ggml=1 ;; *) need_ggml=0 ;; esac
  if [ "$need_ggml" = 1 ] && ! .venv/bin/python -c "import ggml" 2>/dev/null; then
    # built from its sdist with the flags above, never from a wheel cached from another build
    .venv/bin/python -m pip install -q --disable-pip-version-check --no-cache-dir --no-binary ggml-python ggml-python==0.0.45
  fi
  # llama-cpp-python with its RPC backend (refimpl serve's client; tests/rpc): rebuilt if an older build lacks it
  if [ "$need_ggml" = 1 ] && ! .venv/bin/python -c "import llama_cpp, os, sys; \
sys.exit(not os.path.exists(os.path.join(os.path.dirname(llama_cpp.__file__), 'lib', 'libggml-rpc.so.0')))" 2>/dev/null; then
    # llama.cpp for refimpl compare and its tests: the same portable profile, AMX off (its AMX paths crash here)
    .venv/bin/python -m pip uninstall -q -y llama-cpp-python 2>/dev/null || true
    CMAKE_ARGS="$CMAKE_ARGS -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DGGML_LLAMAFILE=ON -DGGML_RPC=ON \
-DLLAMA_BUILD_EXAMPLES=OFF" .venv/bin/python -m pip install -q --disable-pip-version-check --no-cache-dir \
      --no-binary llama-cpp-python llama-cpp-python==0.3.36
  fi
  .venv/bin/python -m pip install -q --disable-pip-version-check -e "$spec"
  # with Numba: compile the kernels the main job's generation runs into Numba's cache now, as installing a
  # compiled library compiles it, rather than in the main job's first run between loading the model and its first
  # token (refimpl.textgen.precompile; a failure here only leaves that compile to the first run)
  case ",$extras," in *,numba,*)
    echo "setup.sh: compiling refimpl's Numba kernels for text generation (once per install)..." >&2
    .venv/bin/python -c "from refimpl.textgen import precompile; print(f'setup.sh: compiled in {precompile():.0f} s')" >&2 \
      || echo "setup.sh: precompiling failed; the first run compiles instead" >&2 ;;
  esac
  touch "$stamp"
fi
