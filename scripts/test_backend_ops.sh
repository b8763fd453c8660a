#!/usr/bin/env bash
# ggml's own test-backend-ops against refimpl: builds it (scripts/build_llamacpp.sh, cached), serves refimpl over
# ggml's RPC protocol, and runs every case on the RPC device in each numerics mode.
#
#   bash scripts/test_backend_ops.sh [--ops ADD,MUL_MAT,...] [--params REGEX] [--modes exact,ggml]
#                                    [--backend numpy|numba] [--out DIR] [--doc docs/test-backend-ops.md] [--check]
#
# --params: only the cases whose parameters match REGEX (test-backend-ops -p), e.g. --params q2_0.
#
# Writes DIR/tbo-MODE.sql (test-backend-ops --output sql), DIR/serve-MODE.log and DIR/meta.json, then the per-op
# table (scripts/test_backend_ops_report.py) to --doc if given, else to stdout. --check: exit 1 when a case of
# an op refimpl computes fails ggml's budget.
set -uo pipefail
cd "$(dirname "$0")/.."
ops="" params="" modes="exact,ggml" backend="numpy" out="" doc="" check=""
while [ $# -gt 0 ]; do
  case "$1" in
    --ops) ops="$2"; shift 2 ;;
    --params) params="$2"; shift 2 ;;
    --modes) modes="$2"; shift 2 ;;
    --backend) backend="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --doc) doc="$2"; shift 2 ;;
    --check) check="--check"; shift ;;
    *) echo "test_backend_ops.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
py=.venv/bin/python
[ -x "$py" ] || { echo "test_backend_ops.sh: no .venv (run scripts/setup.sh first)" >&2; exit 1; }
bin="$(bash scripts/build_llamacpp.sh | tail -1)" || exit 1
out="${out:-$(mktemp -d /tmp/refimpl-tbo-XXXXXX)}"
mkdir -p "$out"
start_all=$(date +%s)
declare -A secs
for mode in ${modes//,/ }; do
  port=$($py -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
  .venv/bin/refimpl serve --port "$port" --backend "$backend" --numerics "$mode" -v >"$out/serve-$mode.log" 2>&1 &
  srv=$!
  for _ in $(seq 100); do grep -q "listening on" "$out/serve-$mode.log" 2>/dev/null && break; sleep 0.1; done
  t0=$(date +%s)
  GGML_RPC_SERVERS="127.0.0.1:$port" "$bin/test-backend-ops" test -b RPC0 ${ops:+-o "$ops"} ${params:+-p "$params"} --output sql \
    >"$out/tbo-$mode.sql" 2>"$out/tbo-$mode.err"
  secs[$mode]=$(( $(date +%s) - t0 ))
  kill "$srv" 2>/dev/null; wait "$srv" 2>/dev/null
  echo "test-backend-ops, $mode numerics: ${secs[$mode]} s" >&2
done
cpu="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
$py - "$out" "$ops" "$modes" "$backend" "$cpu" "$bin" <<PY
import json, sys, datetime
out, ops, modes, backend, cpu, bindir = sys.argv[1:7]
params = "$params"
meta = {"command": "bash scripts/test_backend_ops.sh" + (f" --ops {ops}" if ops else "")
        + (f" --params {params}" if params else "") + f" --modes {modes} --backend {backend}",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "cpu": cpu,
        "backend": backend, "ops": ops,
        "build": "llama-cpp-python 0.3.36 sdist (ggml 0.25.3), -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON "
                 "-DGGML_FMA=ON -DGGML_F16C=ON, AMX off, -DGGML_RPC=ON (scripts/build_llamacpp.sh)"}
meta.update({f"seconds_{k}": float(v) for k, v in zip("${!secs[@]}".split(), "${secs[@]}".split())})
json.dump(meta, open(f"{out}/meta.json", "w"), indent=1)
PY
$py scripts/test_backend_ops_report.py "$out" --modes "$modes" ${doc:+--out "$doc"} $check
rc=$?
echo "test-backend-ops results in $out ($(( $(date +%s) - start_all )) s)" >&2
exit $rc
