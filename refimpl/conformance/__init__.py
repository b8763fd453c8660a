"""refimpl judges ggml: ggml's own test-backend-ops, with refimpl as the reference every backend is measured against.

    refimpl conformance -b cpu [-o OPS] [-p REGEX] [--out DIR]

test-backend-ops (llama.cpp's, from the llama-cpp-python 0.3.36 sdist, built by scripts/build_llamacpp.sh with
scripts/patches/test-backend-ops-judge.patch) computes each case, on the same inputs, three ways: by the backend
under test, by ggml-cpu in the reference mode test-backend-ops compares against today (`use_ref`), and by refimpl
served over ggml's RPC protocol in exact numerics (RPC0). A second server in ggml numerics (RPC1) computes a case
only where the others disagree, to tell "refimpl's two numerics differ here" apart from a wrong backend. The
patch measures each side against refimpl with the case's own error function (NMSE for most ops) and writes one
JSON line per case; this module turns those lines into verdicts (`verdict`), `DIR/cases.jsonl` and `DIR/report.md`.

A verdict, per case (`budget` is ggml's own for the case):

    agree            both sides within budget of refimpl, and of each other
    backend wrong    the backend under test over budget against refimpl, ggml-cpu within it
    ggml-cpu wrong   ggml-cpu over budget against refimpl, the backend within it
    both wrong       both over budget against refimpl
    undecided        refimpl's exact and ggml numerics differ by more than the budget there; the op's result is
                     implementation-defined (argsort ties, top_k order); refimpl did not compute the node; or
                     the two sides are each within budget of refimpl but not of each other

A case ggml-cpu cannot run is judged on the backend alone (`cpu_supported` false: "checked for the first time").
"""
from __future__ import annotations

import collections
import contextlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..cliargs import above, at_least
from .verdicts import VERDICTS, ConformanceError, judge, read_cases, summarize, to_json, verdict  # noqa: F401

REPO = Path(__file__).resolve().parents[2]
SUBSETS = {"ci": Path(__file__).parents[1] / "data" / "conformance" / "ci.txt"}   # scripts/conformance_subset.py
CASE_TIMEOUT = 900.0        # seconds without a judged case before test-backend-ops is killed (--case-timeout)



@dataclass(frozen=True)
class Backend:
    """A ggml backend refimpl can judge: the build of test-backend-ops it needs (scripts/build_llamacpp.sh's
    profile) and the device name test-backend-ops gives it."""
    name: str
    profile: str
    device: str
    about: str


BACKENDS = {b.name: b for b in (
    Backend("cpu", "portable", "CPU", "ggml-cpu, the portable AVX2 build llama.cpp's goldens use"),
    Backend("cpu-native", "native", "CPU", "ggml-cpu built for this machine's own ISA (-DGGML_NATIVE=ON)"),
    Backend("blas", "blas", "BLAS", "ggml-blas on OpenBLAS (Debian's libopenblas-dev)"),
    Backend("vulkan", "vulkan", "Vulkan0", "ggml-vulkan on Mesa's lavapipe (Debian's mesa-vulkan-drivers)"),
)}



# --------------------------------------------------------------------------------------------- running

def build(backend: Backend) -> Path:
    """The directory of test-backend-ops built for `backend` (scripts/build_llamacpp.sh, cached)."""
    script = REPO / "scripts" / "build_llamacpp.sh"
    if not script.exists():
        raise ConformanceError(f"{script} is missing: refimpl conformance runs from a source checkout")
    p = subprocess.run(["bash", str(script), "--profile", backend.profile], capture_output=True, text=True)
    if p.returncode != 0:
        last = [ln for ln in p.stderr.splitlines() if ln.strip()]
        raise ConformanceError(f"building test-backend-ops for {backend.name} failed: "
                               f"{last[-1] if last else 'no output'}")
    return Path(p.stdout.strip().splitlines()[-1])


class _Children:
    """The processes a run has started and not yet ended (refimpl's servers, test-backend-ops), so that an
    interrupted run (Ctrl-C, SIGTERM) ends them all, in whichever thread they were started, instead of leaving
    them running or waiting for them: `stop_all` terminates them and sets `stopping`, which the threads of a
    split run see and end on."""

    def __init__(self):
        self.lock, self.procs, self.stopping = threading.Lock(), set(), threading.Event()

    def add(self, proc: subprocess.Popen) -> subprocess.Popen:
        with self.lock:
            self.procs.add(proc)
        if self.stopping.is_set():
            _end(proc)
        return proc

    def discard(self, proc: subprocess.Popen) -> None:
        with self.lock:
            self.procs.discard(proc)

    def stop_all(self) -> None:
        self.stopping.set()
        with self.lock:
            procs = list(self.procs)
        for proc in procs:
            _end(proc)


def _end(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """Terminate `proc` and reap it (killed after `grace` seconds)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


_CHILDREN = _Children()


class Interrupted(KeyboardInterrupt):
    """A worker thread of a split run, ending because the run was interrupted."""


class _Server:
    """`refimpl serve` in a child process on a free loopback port; its log in `log`."""

    def __init__(self, numerics: str, log: Path, timeout: float = 120.0):
        self.log = log
        cmd = [sys.executable, "-m", "refimpl", "serve", "--port", "0", "--numerics", numerics]
        self.proc = _CHILDREN.add(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=open(log, "w"), text=True))
        deadline = time.monotonic() + timeout
        line = ""
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            m = re.match(r"listening on (\S+):(\d+)", line)
            if m:
                self.endpoint = f"127.0.0.1:{m.group(2)}"
                return
        self.stop()
        raise ConformanceError(f"the reference server (refimpl serve --numerics {numerics}) did not start: "
                               f"see {log}")

    def stop(self) -> None:
        _end(self.proc)
        _CHILDREN.discard(self.proc)


class _Remote:
    """A refimpl server already running (here or on another host), named by --servers: nothing to start or stop."""

    def __init__(self, endpoint: str):
        self.endpoint = endpoint

    def stop(self) -> None:
        pass


def servers_option(text: str, timeout: float = 10.0) -> list[tuple[str, str | None]]:
    """--servers: comma-separated entries, each `HOST:PORT` (a `refimpl serve` in exact numerics) or
    `HOST:PORT+HOST:PORT` (then one in ggml numerics, the second reference), one test-backend-ops process per
    entry. Every endpoint is checked to answer ggml's RPC HELLO before anything runs (ConformanceError naming
    it otherwise). Nothing tells the numerics a server computes in: starting them as named is the caller's part."""
    from ..rpc import Client
    entries = []
    for item in (t.strip() for t in text.split(",")):
        parts = item.split("+")
        if not item or len(parts) > 2:
            raise ConformanceError(f"--servers {text!r}: each entry is HOST:PORT or HOST:PORT+HOST:PORT, "
                                   f"not {item!r}")
        for ep in parts:
            host, _, port = ep.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ConformanceError(f"--servers: {ep!r} is not HOST:PORT (a port from 1 to 65535)")
            try:
                Client(host.strip("[]"), int(port), timeout=timeout).close()
            except (OSError, ValueError) as e:
                raise ConformanceError(f"--servers: no ggml RPC server answers at {ep} ({e})") from None
        entries.append((parts[0], parts[1] if len(parts) == 2 else None))
    return entries


def _devices(bindir: Path, backend: Backend, env: dict) -> dict[str, str]:
    """test-backend-ops' devices in this build, name -> description (the CPU's is its model name), asked of
    test-backend-ops itself; fails with the list when the build has no `backend.device` (e.g. lavapipe absent)."""
    found: dict[str, str] = {}
    for dev in dict.fromkeys((backend.device, "CPU")):
        p = subprocess.run([str(bindir / "test-backend-ops"), "support", "-b", dev, "-o", "NONE"],
                           capture_output=True, text=True, env=env, timeout=300)
        for name, desc in re.findall(r"^Backend \d+/\d+: (\S+)\n(?:  Device description: (.*))?", p.stdout, re.M):
            found[name] = desc or found.get(name, "")
    if backend.device not in found:
        hint = " (is Mesa's lavapipe installed? apt-get install mesa-vulkan-drivers)" if \
            backend.name == "vulkan" else ""
        raise ConformanceError(f"test-backend-ops built for {backend.name} has no device {backend.device}"
                               f"{hint}; it has: {', '.join(n for n in found if not n.startswith('RPC')) or 'none'}")
    return found


def _check_ops(bindir: Path, ops: str, env: dict) -> list[str]:
    """The op names in `ops` that test-backend-ops' `support` listing does not know: an unknown op when no op
    of ggml has the name, else (a composite test such as TOPK_QSA, which `support` does not list) returned,
    to be checked against the run's records."""
    names = [e for e in ops.split(",") if re.fullmatch(r"[A-Z0-9_]+", e)]
    if not names:
        return []
    found = {case.split("(", 1)[0] for case, _ in _case_list(bindir, "CPU", ",".join(names), None, env)}
    return [n for n in names if n not in found]


def _unknown_ops(names: list[str]) -> ConformanceError:
    return ConformanceError(f"unknown op {', '.join(names)}: test-backend-ops has no case of it (its ops are "
                            f"ggml's names as test-backend-ops prints them: ADD, MUL_MAT, FLASH_ATTN_EXT, ...)")


# test-backend-ops takes the cases after a crash as one -o argument of full case strings; Linux refuses a single
# argument over 128 KiB (MAX_ARG_STRLEN: "Argument list too long"), so they go in batches below that
_MAX_SELECTION = 100_000


def _batch(todo: list[str]) -> list[str]:
    """The first cases of todo whose -o selection (joined by commas) is at most _MAX_SELECTION characters
    (at least one case)."""
    out, n = [], 0
    for c in todo:
        if out and n + len(c) + 1 > _MAX_SELECTION:
            break
        out.append(c)
        n += len(c) + 1
    return out


def _pass(bindir: Path, device: str, ops: str | None, params: str | None, env: dict, out: Path, tag: str,
          progress, t0, case_timeout: float = math.inf, cases: list[str] | None = None
          ) -> tuple[list[dict], list[dict], list[str], list | None]:
    """One test-backend-ops run under the judge on `device`, going on after a crash or a case that gives no result
    within `case_timeout` seconds (the process is killed and restarted after it): (the patch's lines, parsed;
    a record per crash or time-out; the cases the device cannot run; test-backend-ops' listing of the selection
    where a crash made it read it). `cases` (instead of ops/params): exactly these case strings, run in -o
    batches (one share of a run split over several servers)."""
    raw_path = out / f"raw{tag}.jsonl"
    raw_path.unlink(missing_ok=True)
    env = {**env, "GGML_JUDGE_OUT": str(raw_path)}
    log_path = out / f"test-backend-ops{tag}.log"
    log_path.write_text("")
    crashes, selection, listing, batch = [], ops, None, None
    if cases is not None:
        if not cases:
            return [], [], [], []
        ops, params, listing = None, None, [(c, True) for c in cases]
        batch = _batch(cases)
        selection = ",".join(batch)
    attempted: set[str] = set()        # cases of a batch that ended normally: never run again, judged or not
    died_after: dict[str, str] = {}     # case -> how the process died on it after earlier cases, ran alone

    def run_tbo(selection, params):
        cmd = [str(bindir / "test-backend-ops"), "test", "-b", device]
        cmd += ["-o", selection] if selection else []
        cmd += ["-p", params] if params else []
        with open(log_path, "a") as log:
            proc = _CHILDREN.add(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env))
            try:
                stalled = _follow(proc, raw_path, progress, t0, case_timeout)
            finally:                              # an interrupt in this thread: test-backend-ops ends with it
                _end(proc)
                _CHILDREN.discard(proc)
        if _CHILDREN.stopping.is_set():
            raise Interrupted("the run was interrupted")
        return proc, stalled

    while True:
        proc, stalled = run_tbo(selection, params)
        normal_end = proc.returncode in (0, 1) and not stalled     # 1: some case failed, which the verdicts say
        if normal_end and batch is None:
            break
        if normal_end:
            attempted.update(batch)
        # it died on a case (the backend's crash is that case's verdict, and the run goes on after it), or a
        # batch of the cases after such a case ended: what is left of the selection
        if listing is None:
            listing = _case_list(bindir, device, ops, params, env)
        judged = collections.Counter(json.loads(ln)["case"] for ln in raw_path.read_text().splitlines()) \
            if raw_path.exists() else collections.Counter()
        for c in crashes:
            judged[c["case"]] += 1
        # `support` lists some cases as runnable that `test` then refuses ("not supported" in the log, no line
        # of the judge): not cases to run again, nor the case it died on
        refused = set(re.findall(r"^  (\S+\(.*\)): not supported \[", log_path.read_text(), re.M))
        todo = []
        for c, ok in listing:
            if not ok or c in attempted or c in refused:
                continue
            if judged[c] > 0:
                judged[c] -= 1
            else:
                todo.append(c)
        # composite and fused tests are absent from `support`'s listing: an explicit case list brings them back
        listed = {c for c, _ in listing}
        extra = [c for c in (ops or "").split("),") if "(" in c]
        extra = [c if c.endswith(")") else c + ")" for c in extra]
        todo += [c for c in extra if c not in listed and judged[c] <= 0 and c not in todo and c not in attempted]
        if not todo:
            break
        if not normal_end:
            if stalled:
                crashes.append(_timeout_record(todo[0], device, case_timeout))
                progress(f"conformance: no result within {case_timeout:.0f} s on {todo[0]} (test-backend-ops "
                         f"killed); going on with the {len(todo) - 1} cases after it")
            else:
                # a process that dies after many cases (a heap corrupted earlier: lavapipe's) may die on any case
                # after the one at fault: the case runs once more alone, and is judged on that run if it ends
                how = _how(proc.returncode)
                progress(f"conformance: test-backend-ops died ({how}) on {todo[0]}; running that case alone")
                size = raw_path.stat().st_size if raw_path.exists() else 0
                alone, alone_stalled = run_tbo(todo[0], None)
                ran = raw_path.exists() and raw_path.stat().st_size > size
                if alone.returncode in (0, 1) and not alone_stalled and ran:
                    died_after[todo[0]] = how
                    progress(f"conformance: alone it ran; going on with the {len(todo) - 1} cases after it")
                else:
                    crashes.append(_crash_record(todo[0], device, alone.returncode if not alone_stalled
                                                 else proc.returncode, again=not alone_stalled))
                    progress(f"conformance: alone it died too; going on with the {len(todo) - 1} cases after it")
            todo = todo[1:]
            if not todo:
                break
        batch = _batch(todo)
        selection = ",".join(batch)
    raws = [json.loads(ln) for ln in raw_path.read_text().splitlines()] if raw_path.exists() else []
    for r in raws:
        if r["case"] in died_after:
            r["crash_in_sequence"] = died_after[r["case"]]
    unsupported = set(re.findall(r"^  (\S+\(.*\)): not supported \[", log_path.read_text(), re.M))
    # after a crash, the cases past it that the backend cannot run were never printed: the listing says
    done = {r["case"] for r in raws} | {c["case"] for c in crashes}
    unsupported = sorted(unsupported | {c for c, ok in listing or () if not ok and c not in done})
    return raws, crashes, unsupported, listing


def _cpu_alone(raw_rec: dict, device: str) -> dict:
    """A record of the ggml-cpu pass as one of `device`'s: the backend cannot run the case (no error of its own),
    ggml-cpu's is that of its reference mode."""
    r = dict(raw_rec, backend=device, backend_supported=False, err_backend=None, err_backend_cpu=None,
             budget=raw_rec.get("budget_cpu", raw_rec["budget"]))
    if r.get("worst"):
        r["worst"] = dict(r["worst"], backend=None)
    return r


def run(backend: str, ops: str | None = None, params: str | None = None, out: str | os.PathLike | None = None,
        *, cases_file: str | os.PathLike | None = None, second_reference: bool = True, cpu_alone: bool = True,
        case_timeout: float = CASE_TIMEOUT, jobs: int = 1, servers: str | None = None, progress=print) -> dict:
    """Judge `backend` (a name of BACKENDS) on test-backend-ops' cases (`ops`: its -o, `params`: its -p, or
    `cases_file`: one full case string per line), in `jobs` test-backend-ops processes at once; write
    DIR/raw.jsonl (the patch's lines), DIR/cases.jsonl (the records), DIR/unsupported.txt (the cases the backend
    cannot run), DIR/report.md and DIR/meta.json; return the summary (counts per verdict, seconds, the paths).
    `servers`: running refimpl servers to judge against instead of starting them here (on this machine or
    others: `servers_option`), one test-backend-ops process per entry."""
    if backend not in BACKENDS:
        raise ConformanceError(f"unknown backend {backend!r}; refimpl judges: {', '.join(BACKENDS)}")
    be = BACKENDS[backend]
    ops = _selection(ops, params, cases_file)
    out = Path(out) if out else Path(f"conformance-{backend}-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    with _sigterm_interrupts():
        try:
            return _run(be, ops, params, out, cases_file, second_reference, cpu_alone, case_timeout, jobs, progress,
                        servers)
        except KeyboardInterrupt:                   # Ctrl-C, SIGTERM, or a share that saw either
            _CHILDREN.stop_all()
            progress(f"conformance: interrupted; its test-backend-ops processes and refimpl servers are stopped; "
                     f"what was judged is in {out}/raw*.jsonl")
            raise


@contextlib.contextmanager
def _sigterm_interrupts():
    """SIGTERM, while a run goes on in the main thread, raises KeyboardInterrupt as Ctrl-C does, so that the
    run ends its child processes (Python's default for SIGTERM is to exit at once, leaving them running)."""
    main = threading.current_thread() is threading.main_thread()
    old = signal.signal(signal.SIGTERM, _interrupt) if main else None
    try:
        yield
    finally:
        if main:
            signal.signal(signal.SIGTERM, old)


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def _run(be, ops, params, out: Path, cases_file, second_reference, cpu_alone, case_timeout, jobs, progress,
         servers=None) -> dict:
    """`run` after its arguments are checked: build, judge, write the outputs."""
    backend = be.name
    remote = servers_option(servers) if servers else None
    if remote:
        if jobs not in (1, len(remote)):
            raise ConformanceError(f"--jobs {jobs} with {len(remote)} --servers entries: one test-backend-ops "
                                   "process runs per entry (leave out --jobs)")
        jobs = len(remote)
        if second_reference and not all(ggml for _, ggml in remote):
            second_reference = False
            progress("conformance: no ggml-numerics server in --servers (EXACT+GGML): the second reference is off")
    _CHILDREN.stopping.clear()              # a run interrupted before, in this process, is over
    t0 = time.monotonic()
    progress(f"conformance: building test-backend-ops for {backend} ({be.about})")
    bindir = build(be)
    env = dict(os.environ)
    if be.name == "vulkan":
        env.setdefault("GGML_VK_VISIBLE_DEVICES", "0")     # lavapipe is a CPU-type device, skipped unless named
    devices = _devices(bindir, be, env)
    unlisted = _check_ops(bindir, ops, env) if ops and cases_file is None else []
    from .verdicts import ops_known
    if [n for n in unlisted if not ops_known(n)]:
        raise _unknown_ops([n for n in unlisted if not ops_known(n)])
    if int(jobs) != jobs or jobs < 1:
        raise ConformanceError(f"--jobs {jobs}: a whole number of test-backend-ops processes, at least 1")
    records, unsupported = _judge_passes(bindir, be, ops, params, env, out, progress, t0, case_timeout,
                                         second_reference, cpu_alone, int(jobs), remote)
    seen_ops = {r["op"] for r in records} | {c.split("(", 1)[0] for c in unsupported}
    if [n for n in unlisted if n not in seen_ops]:
        raise _unknown_ops([n for n in unlisted if n not in seen_ops])
    if not records:
        what = " ".join(x for x in (f"-o {ops[:80]!r}" if ops else "", f"-p {params!r}" if params else "") if x)
        raise ConformanceError(f"no test-backend-ops case matched {what or 'the selection'} on "
                               f"{be.device} (ops are test-backend-ops' names: ADD, MUL_MAT, FLASH_ATTN_EXT, ...); "
                               f"its log: {out / 'test-backend-ops.log'}")
    seconds = time.monotonic() - t0
    _write_outputs(out, records, unsupported, be, bindir, devices, ops if cases_file is None
                   else f"{len(records)} cases of {cases_file}", params, seconds)
    summary = summarize(records)
    summary.update(seconds=seconds, out=str(out), unsupported=len(unsupported))
    return summary


def _selection(ops: str | None, params: str | None, cases_file) -> str | None:
    """test-backend-ops' -o for the selection: `ops` as given, or the case strings of cases_file (one per
    line, # comments); -p checked to be a regular expression."""
    if params is not None:
        try:
            re.compile(params)
        except re.error as e:
            raise ConformanceError(f"-p {params!r} is not a regular expression: {e}") from None
    if cases_file is None:
        return ops
    wanted = [ln.strip() for ln in Path(cases_file).read_text().splitlines() if ln.strip()
              and not ln.startswith("#")]
    bad = [c for c in wanted if not re.fullmatch(r"[A-Z0-9_]+\(.*\)", c)]
    if bad:
        raise ConformanceError(f"{cases_file}: {bad[0]!r} is not a test-backend-ops case string (OP(params))")
    return ",".join(wanted)


def _judge_passes(bindir: Path, be, ops, params, env: dict, out: Path, progress, t0: float, case_timeout: float,
                  second_reference: bool, cpu_alone: bool, jobs: int = 1, remote=None) -> tuple[list, list]:
    """(records, the cases left unjudged: the backend cannot run them, nor ggml-cpu where the second pass ran):
    test-backend-ops' pass on the backend against refimpl's servers (exact; ggml numerics as the second
    reference), then, where asked, the cases the backend cannot run on ggml-cpu alone. With jobs > 1 each
    pass's cases are dealt round-robin to `jobs` test-backend-ops processes, each with servers of its own, run
    at once; the records come back in test-backend-ops' order."""
    progress(f"conformance: {be.device} against refimpl (exact) and ggml-cpu"
             + ("; refimpl ggml numerics where they disagree" if second_reference else "")
             + (f"; {jobs} test-backend-ops processes, each with its own refimpl servers" if jobs > 1 else "")
             + (f" (running: {'; '.join(' and '.join(filter(None, r)) for r in remote)})" if remote else ""))
    if jobs == 1:
        raws, crashes, unsupported = _servers_pass(bindir, be.device, env, out, "", progress, t0, case_timeout,
                                                   second_reference, ops=ops, params=params,
                                                   remote=remote[0] if remote else None)
    else:
        listing = _case_list(bindir, be.device, ops, params, env)
        listed = {c for c, _ in listing}
        extra = [c if c.endswith(")") else c + ")" for c in (ops or "").split("),") if "(" in c]
        # one share per distinct case string: -o runs every test of that string (a few tests print alike)
        todo = list(dict.fromkeys([c for c, ok in listing if ok] + [c for c in extra if c not in listed]))
        raws, crashes, unsupported = _split_pass(bindir, be.device, todo, env, out, "", progress, t0,
                                                 case_timeout, second_reference, jobs, remote)
        unsupported = sorted(set(unsupported) | {c for c, ok in listing if not ok})
    records = [judge(r) for r in raws] + crashes
    if cpu_alone and be.device != "CPU" and unsupported:
        # what the backend cannot run, ggml-cpu (its reference mode, as test-backend-ops uses it) judged alone
        progress(f"conformance: the {len(unsupported)} cases {be.device} cannot run, on ggml-cpu alone")
        # named case by case, in -o batches (a thousand case strings are over Linux's 128 KiB for one argument);
        # what is left unjudged: the cases ggml-cpu cannot run either
        raws, crashes, unsupported = _split_pass(bindir, "CPU", list(unsupported), env, out, "-cpu-alone",
                                                 progress, t0, case_timeout, second_reference, jobs, remote)
        records += [judge(_cpu_alone(r, be.device)) for r in raws] + crashes
    return records, unsupported


def _servers_pass(bindir: Path, device: str, env: dict, out: Path, tag: str, progress, t0: float,
                  case_timeout: float, second_reference: bool, *, ops=None, params=None, cases=None, remote=None):
    """One `_pass` against refimpl servers of its own (exact as RPC0, ggml numerics as RPC1), stopped whatever
    happens, or against the running servers `remote` names ((exact endpoint, ggml endpoint or None), see
    `servers_option`): (the patch's lines, crash/time-out records, the cases `device` cannot run)."""
    if remote:
        servers = [_Remote(e) for e in remote[:2 if second_reference else 1]]
    else:
        servers = [_Server("exact", out / f"serve-exact{tag}.log")]
    try:
        if second_reference and not remote:
            servers.append(_Server("ggml", out / f"serve-ggml{tag}.log"))
        env = {**env, "GGML_RPC_SERVERS": ",".join(s.endpoint for s in servers), "GGML_JUDGE_REF": "RPC0"}
        if second_reference:
            env["GGML_JUDGE_REF2"] = "RPC1"
        raws, crashes, unsupported, _ = _pass(bindir, device, ops, params, env, out, tag, progress, t0,
                                              case_timeout, cases=cases)
    finally:
        for s in servers:
            s.stop()
    return raws, crashes, unsupported


def _split_pass(bindir: Path, device: str, todo: list[str], env: dict, out: Path, tag: str, progress, t0: float,
                case_timeout: float, second_reference: bool, jobs: int, remote=None):
    """`_servers_pass` over `todo` dealt round-robin (neighbouring cases of one op are alike in cost) to `jobs`
    shares run at once in threads; the results merged back into `todo`'s order. One job: `tag` and the
    progress lines as they are."""
    _CHILDREN.stopping.clear()
    shares = [todo[i::jobs] for i in range(jobs)]
    results: list = [None] * jobs
    errors: list[BaseException] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        def say(m: str) -> None:
            with lock:
                progress(m.replace("conformance:", f"conformance [{i + 1}/{jobs}]:", 1) if jobs > 1 else m)
        try:
            results[i] = _servers_pass(bindir, device, env, out, f"{tag}-{i + 1}" if jobs > 1 else tag, say, t0,
                                       case_timeout, second_reference, cases=shares[i],
                                       remote=remote[i] if remote else None)
        except BaseException as e:          # noqa: BLE001 -- raised again in the calling thread
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,), name=f"conformance-{i + 1}") for i in range(jobs)
               if shares[i]]
    for t in threads:
        t.start()
    try:
        for t in threads:
            t.join()
    except BaseException:                     # Ctrl-C or SIGTERM in this thread: end every share's processes
        _CHILDREN.stop_all()
        for t in threads:
            t.join(60)
        raise
    if errors:
        raise errors[0]
    order = {c: k for k, c in enumerate(todo)}
    raws = sorted((r for res in results if res for r in res[0]), key=lambda r: order.get(r["case"], len(order)))
    crashes = sorted((r for res in results if res for r in res[1]), key=lambda r: order.get(r["case"], len(order)))
    unsupported = sorted({c for res in results if res for c in res[2]})
    return raws, crashes, unsupported


def _write_outputs(out: Path, records: list, unsupported: list, be, bindir: Path, devices: dict, selection: str,
                   params, seconds: float) -> None:
    """DIR/cases.jsonl, meta.json, report.md (with the plot) and unsupported.txt."""
    with open(out / "cases.jsonl", "w") as f:
        for r in records:
            f.write(to_json(r) + "\n")
    meta = {"backend": be.name, "device": be.device, "about": be.about, "build": str(bindir),
            "ops": selection, "params": params,
            "seconds": round(seconds, 1), "cpu": devices.get("CPU") or "?",
            "device_description": devices.get(be.device) or "",
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    from .report import write_report
    write_report(records, meta, out, unsupported)
    (out / "unsupported.txt").write_text("".join(c + "\n" for c in unsupported))


def _case_list(bindir: Path, device: str, ops: str | None, params: str | None, env: dict) -> list[tuple[str, bool]]:
    """test-backend-ops' cases for this selection, in the order it runs them, each with whether `device`
    supports it."""
    import csv
    import io
    cmd = [str(bindir / "test-backend-ops"), "support", "-b", device, "--output", "csv"]
    cmd += ["-o", ops] if ops else []
    cmd += ["-p", params] if params else []
    env = {k: v for k, v in env.items() if not k.startswith("GGML_JUDGE")}
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    return [(f"{r['op_name']}({r['op_params']})", r.get("supported") == "1")
            for r in csv.DictReader(io.StringIO(p.stdout)) if r.get("backend_name") == device]


def _how(status: int) -> str:
    return f"signal {-status}" if status < 0 else f"exit status {status}"


def _crash_record(case: str, device: str, status: int, again: bool = True) -> dict:
    """A case the backend's process died on, in its run and again alone (`again`): `backend wrong`, with the exit
    status (negative: the signal)."""
    how = _how(status)
    alone = "and again when run alone" if again else "(alone it gave no result in time)"
    return {"op": case.split("(", 1)[0], "case": case, "backend": device, "budget": None, "err_backend": math.inf,
            "err_cpu": None, "cpu_supported": True, "verdict": "backend wrong", "crash": how,
            "reason": f"test-backend-ops died on this case ({how}) after the cases before it, {alone}"}


def _timeout_record(case: str, device: str, limit: float) -> dict:
    """A case that gave no result within `limit` seconds: `undecided` -- the backend, ggml-cpu or refimpl may be
    the slow one, and nothing was computed to compare."""
    return {"op": case.split("(", 1)[0], "case": case, "backend": device, "budget": None, "err_backend": None,
            "err_cpu": None, "cpu_supported": True, "verdict": "undecided", "timeout": limit,
            "reason": f"no result within {limit:.0f} s (--case-timeout): test-backend-ops was killed on this case"}


def _follow(proc: subprocess.Popen, raw_path: Path, progress, t0: float, limit: float = math.inf,
            every: float = 10.0) -> bool:
    """Wait for test-backend-ops, printing a progress line every `every` seconds and at the end; kill it when no
    case has been judged for `limit` seconds, and say so (True)."""
    seen, last_op, shown = 0, "", time.monotonic()
    last_result = time.monotonic()
    pos = raw_path.stat().st_size if raw_path.exists() else 0
    while True:
        if _CHILDREN.stopping.is_set():          # the run was interrupted (in another thread)
            return False
        done = proc.poll() is not None
        if raw_path.exists():
            with open(raw_path) as f:
                f.seek(pos)
                chunk = f.read()
            lines = chunk.split("\n")
            pos += len(chunk) - len(lines[-1])
            for ln in lines[:-1]:
                seen += 1
                last_op = json.loads(ln)["op"]
                last_result = time.monotonic()
        if done or time.monotonic() - shown >= every:
            progress(f"conformance: [{time.monotonic() - t0:6.0f} s] {seen:5d} cases judged"
                     + (f", now {last_op}" if last_op and not done else ""))
            shown = time.monotonic()
        if done:
            return False
        if time.monotonic() - last_result > limit:
            proc.kill()
            proc.wait()
            return True
        time.sleep(0.5)


def summary_line(backend: str, s: dict) -> str:
    v = s["verdicts"]
    parts = [f"{v[k]} {k}" for k in VERDICTS if v[k] or k == "agree"]
    alone = s.get("cpu_alone", 0)
    return (f"{backend}: {s['cases']} cases, {', '.join(parts)}; {s['first_time']} checked for the first time "
            f"(ggml-cpu cannot run them); {s.get('unsupported', 0) + alone} the backend cannot run"
            + (f" ({alone} of them judged on ggml-cpu alone, {s.get('cpu_alone_wrong', 0)} not agreeing)" if alone
               else "") + f"; {s['seconds']:.0f} s; {s['out']}/report.md")


# --------------------------------------------------------------------------------------------- command line

def add_parser(sub) -> None:
    """Register `refimpl conformance` on the command line's subparsers."""
    s = sub.add_parser("conformance", help="judge a ggml backend: test-backend-ops' cases computed by the backend, "
                       "by ggml-cpu and by refimpl (the reference), with a verdict per case")
    s.add_argument("-b", "--backend", required=True, metavar="BACKEND",
                   help=f"the ggml backend under test: {', '.join(BACKENDS)}")
    s.add_argument("-o", "--ops", metavar="OPS", help="test-backend-ops' -o: ops (ADD,MUL_MAT,...) or full case "
                   "strings, comma-separated")
    s.add_argument("-p", "--params", metavar="REGEX", help="test-backend-ops' -p: only cases whose parameters "
                   "match REGEX")
    s.add_argument("--cases", metavar="FILE", help="a file of full case strings, one per line (instead of -o)")
    s.add_argument("--subset", choices=sorted(SUBSETS), help="a named subset of cases: ci (one to three cases of "
                   "every op, the ones CI judges)")
    s.add_argument("--out", metavar="DIR", help="where cases.jsonl and report.md go (default "
                   "./conformance-BACKEND-DATE)")
    s.add_argument("--no-cpu-alone", action="store_true", help="skip the second pass, which judges ggml-cpu alone "
                   "on the cases the backend cannot run (test-backend-ops skips them)")
    s.add_argument("--case-timeout", type=above(0, "case-timeout"), default=CASE_TIMEOUT, metavar="SECONDS",
                   help=f"a case with no result after this long is `undecided` (timeout) and the run goes on after "
                   f"it (default {CASE_TIMEOUT:.0f}; a slow device such as lavapipe can sit on one case for tens of "
                   "minutes)")
    s.add_argument("-j", "--jobs", type=at_least(1, "jobs", int), default=1, metavar="N",
                   help="split the cases over N test-backend-ops processes run at once, each with refimpl servers "
                   "of its own (default 1); the records are the same as one process's")
    s.add_argument("--servers", metavar="EXACT[+GGML],...", help="judge against refimpl servers already running "
                   "(`refimpl serve`, here or on other hosts: HOST:PORT in exact numerics, +HOST:PORT in ggml numerics "
                   "for the second reference) instead of starting them; one test-backend-ops process per entry")
    s.add_argument("--no-second-reference", action="store_true", help="skip refimpl's ggml numerics (the "
                   "'undecided' check where the sides disagree)")
    s.add_argument("--model", metavar="GGUF", help="judge a whole model instead of test-backend-ops' cases: "
                   "llama.cpp on the backend against refimpl exact, KL divergence per position and the first "
                   "node over its op's budget (refimpl/conformance/model.py)")
    s.add_argument("--prompt", default="The capital of France is", help="the prompt for --model")
    s.set_defaults(fn=cli)


def cli(args) -> int:
    """`refimpl conformance`: progress on stderr, the one-line summary on stdout; exit 0 (the verdicts are the
    output, not the exit status)."""
    if args.backend not in BACKENDS:
        raise ConformanceError(f"unknown backend {args.backend!r}; refimpl judges: {', '.join(BACKENDS)}")
    if args.model:
        return _cli_model(args)
    if sum(map(bool, (args.cases, args.ops, args.subset))) > 1:
        raise ConformanceError("--cases, --subset and -o/--ops each select cases: give one")
    cases = SUBSETS[args.subset] if args.subset else args.cases
    s = run(args.backend, args.ops, args.params, args.out, cases_file=cases,
            second_reference=not args.no_second_reference, cpu_alone=not args.no_cpu_alone,
            case_timeout=args.case_timeout, jobs=args.jobs, servers=args.servers,
            progress=lambda m: print(m, file=sys.stderr))
    print(summary_line(args.backend, s))
    return 0


def _cli_model(args) -> int:
    """`refimpl conformance -b BACKEND --model GGUF`: the model's verdict in a few lines."""
    if args.ops or args.cases or args.subset or args.params:
        raise ConformanceError("--model judges a model's own graph: -o, -p, --cases and --subset do not apply")
    if not Path(args.model).exists():
        raise ConformanceError(f"{args.model}: no such file")
    if args.backend != "cpu" and not os.environ.get("LLAMA_CPP_LIB_PATH"):
        raise ConformanceError(f"judging a model on {args.backend} needs libllama built for it: set "
                               "LLAMA_CPP_LIB_PATH to its directory (llama-cpp-python's own build is the portable "
                               "ggml-cpu, -b cpu)")
    from .model import judge_model
    out = Path(args.out) if args.out else Path(f"conformance-{args.backend}-model")
    gpu = BACKENDS[args.backend].device.startswith("Vulkan")
    r = judge_model(args.model, args.prompt, out=out, progress=lambda m: print(m, file=sys.stderr), offload=gpu,
                    backend_env={"GGML_VK_VISIBLE_DEVICES": "0"} if gpu else None)
    kl = r["kl"]
    print(f"{args.model} on {args.backend}: {len(r['tokens'])} positions, KL(refimpl || backend) mean "
          f"{r['kl_mean']:.3g} max {r['kl_max']:.3g} nats, top-1 agreement {100 * r['top1_agree']:.0f}%")
    print(f"  {r['judged']} nodes judged on their own inputs: {r['over']} over their op's budget, "
          f"{r['undecided']} of them undecided (refimpl's ggml numerics reproduce the backend there)")
    for key, what in (("first_over", "first node wrong"), ("first_undecided", "first undecided")):
        f = r[key]
        if f:
            print(f"  {what}: {f['name']} ({f['op']}, ne {f['ne']}): NMSE {f['nmse']:.3g} > {f['budget']:.3g}; "
                  f"at [{f['index']}] backend {f['backend']:.9g}, refimpl {f['refimpl']:.9g}, refimpl ggml "
                  f"numerics {f['refimpl_ggml']:.9g}")
    for line in r.get("placement", [])[:3]:
        print(f"  llama.cpp: {line}")
    print(f"  per position KL: {' '.join(f'{x:.2g}' for x in kl)}; {out}/model.json")
    return 0
