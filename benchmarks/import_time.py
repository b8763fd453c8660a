"""Cold `import refimpl` time in a fresh interpreter (median of --runs), and that numba stays unimported.

    python -m benchmarks.import_time [--runs 7]
"""
import argparse
import statistics
import subprocess
import sys


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    a = ap.parse_args(argv)
    code = ("import time, sys; t = time.perf_counter(); import refimpl; dt = time.perf_counter() - t; "
            "t = time.perf_counter(); import numpy; base = 0; print(dt, 'numba' in sys.modules)")
    np_code = "import time; t = time.perf_counter(); import numpy; print(time.perf_counter() - t)"
    ts, tn = [], []
    for _ in range(a.runs):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
        ts.append(float(out[0]))
        assert out[1] == "False", "import refimpl imported numba"
        tn.append(float(subprocess.run([sys.executable, "-c", np_code], capture_output=True, text=True,
                                       check=True).stdout))
    print(f"| import refimpl (incl. numpy) | {statistics.median(ts) * 1e3:.0f} ms |")
    print(f"| import numpy alone | {statistics.median(tn) * 1e3:.0f} ms |")


if __name__ == "__main__":
    main()
