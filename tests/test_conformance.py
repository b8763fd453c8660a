"""refimpl.conformance's verdicts, record format and report, on records written as the judge patch writes them.

Each record's errors are placed on either side of its budget, so each test's expected verdict follows from the
definition in refimpl/conformance.py's docstring alone; the runs themselves (test-backend-ops judged) are in
tests/rpc/test_conformance.py."""
import json
import math
import os

import pytest

from refimpl import conformance
from refimpl.conformance import verdicts
from refimpl.conformance import ConformanceError, judge, read_cases, verdict
from refimpl.conformance.report import per_op, write_report

pytestmark = pytest.mark.property        # the verdicts' definitions, checked on records placed around the budget

B = 1e-7      # the budget of most of ggml's ops (NMSE)


def raw(op="ADD", e_b=0.0, e_c=0.0, e_bc=0.0, cpu=True, e_r2=None, ref_nan=0, **kw):
    rec = {"op": op, "case": f"{op}(type=f32,ne=[10,5,4,3])", "backend": "CPU", "budget": B, "budget_cpu": B,
           "cpu_supported": cpu, "err_backend": e_b, "err_cpu": e_c if cpu else None,
           "err_backend_cpu": e_bc if cpu else None, "err_ref2": e_r2, "ref_nan": ref_nan, "nodes": 1,
           "worst": {"node": 3, "name": "out", "node_op": op, "ne": [10, 5, 4, 3], "index": 17,
                     "backend": 1.5, "cpu": 1.25 if cpu else None, "refimpl": 1.0}}
    rec.update(kw)
    return rec


@pytest.mark.parametrize("errors, expected", [
    ((0.0, 0.0, 0.0), "agree"),
    ((B / 2, B / 2, B / 2), "agree"),
    ((B, B, B), "agree"),                         # ggml fails a case only when err > budget
    ((2 * B, 0.0, 2 * B), "backend wrong"),
    ((0.0, 2 * B, 2 * B), "ggml-cpu wrong"),
    ((2 * B, 3 * B, 0.0), "both wrong"),          # the backend shares ggml-cpu's bug: they agree with each other
    ((B / 2, B / 2, 3 * B), "undecided"),         # each near refimpl, apart from each other
    ((math.inf, 0.0, math.inf), "backend wrong"),  # a NaN or a lone infinity is an infinite error
])
def test_verdicts(errors, expected):
    e_b, e_c, e_bc = errors
    assert verdict(raw(e_b=e_b, e_c=e_c, e_bc=e_bc))[0] == expected


def test_a_case_ggml_cpu_cannot_run_is_judged_on_the_backend_alone():
    assert verdict(raw(cpu=False, e_b=B / 2))[0] == "agree"
    v, why = verdict(raw(cpu=False, e_b=5 * B))
    assert v == "backend wrong" and "cannot run" in why


def test_a_case_the_backend_cannot_run_is_judged_on_ggml_cpu_alone():
    """The second pass of a run (`cpu_alone`): test-backend-ops on CPU over the cases the backend refused; its
    reference-mode error is ggml-cpu's, and the backend has none."""
    from refimpl.conformance import _cpu_alone
    sum_case = raw(op="SUM", e_b=0.3, e_c=0.25, e_bc=0.0, budget=B / 2, budget_cpu=B)   # as -b CPU writes it
    rec = judge(_cpu_alone(sum_case, "Vulkan0"))
    assert rec["verdict"] == "ggml-cpu wrong" and "cannot run" in rec["reason"]
    assert rec["backend"] == "Vulkan0" and rec["backend_supported"] is False and rec["err_backend"] is None
    assert rec["err_cpu"] == 0.25 and rec["budget"] == B and rec["worst"]["backend"] is None
    assert judge(_cpu_alone(raw(e_b=5 * B, e_c=B / 2), "Vulkan0"))["verdict"] == "agree"
    s = verdicts.summarize([rec, judge(raw())])
    assert s["cpu_alone"] == 1 and s["cpu_alone_wrong"] == 1
    assert per_op([rec])["SUM"]["unsupported"] == 1


def test_undecided_where_refimpl_numerics_disagree_with_each_other():
    v, why = verdict(raw(e_b=2 * B, e_r2=10 * B))
    assert v == "undecided" and "ggml numerics" in why
    assert verdict(raw(e_b=2 * B, e_r2=B / 10))[0] == "backend wrong"


def test_undecided_where_the_order_is_implementation_defined_or_refimpl_refused():
    assert verdict(raw(op="TOP_K", e_b=1.0, e_bc=1.0))[0] == "undecided"
    assert verdict(raw(op="ARGSORT", e_c=1.0, e_bc=1.0))[0] == "undecided"
    v, why = verdict(raw(e_b=math.inf, e_c=math.inf, ref_nan=12))
    assert v == "undecided" and "did not compute" in why


def test_record_format_round_trips(tmp_path):
    recs = [judge(raw(e_b=math.inf, e_bc=math.inf)), judge(raw()), judge(raw(cpu=False, e_b=B))]
    path = tmp_path / "cases.jsonl"
    path.write_text("".join(verdicts.to_json(r) + "\n" for r in recs))
    for line in path.read_text().splitlines():
        json.loads(line, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))   # strict JSON
    back = read_cases(path)
    assert back[0]["err_backend"] == math.inf and back[0]["verdict"] == "backend wrong"
    assert back[0]["worst"] == {"index": 17, "node": "out", "node_op": "ADD", "ne": [10, 5, 4, 3],
                                "backend": 1.5, "cpu": 1.25, "refimpl": 1.0}
    assert "worst" not in back[1]                     # only verdicts but `agree` carry the worst element
    assert back[2]["err_cpu"] is None and back[2]["cpu_supported"] is False
    required = {"op", "case", "backend", "budget", "err_backend", "err_cpu", "cpu_supported", "verdict"}
    assert all(required <= set(r) for r in back)


def test_report_has_the_per_op_table_and_the_plot(tmp_path):
    pytest.importorskip("matplotlib", reason="the plot needs matplotlib (the notebooks extra)")
    recs = [judge(raw(e_b=2 * B, e_bc=2 * B)), judge(raw(op="SUM", e_c=0.2, e_bc=0.2)), judge(raw(op="SUM")),
            judge(raw(op="CPY", cpu=False))]
    meta = {"backend": "cpu", "device": "CPU", "about": "ggml-cpu", "cpu": "x", "date": "d", "seconds": 1.0}
    text = write_report(recs, meta, tmp_path, ["SUM(type=f32,ne=[1,1,1,1],v=2)"]).read_text()
    assert "| SUM | 2 | 1 | 0 | 1 | 0 | 0 | 0 | 1 |" in text
    assert "`SUM(type=f32,ne=[10,5,4,3])`" in text and "ggml-cpu wrong" in text
    assert (tmp_path / "errors.png").stat().st_size > 10_000
    assert per_op(recs)["CPY"]["first_time"] == 1


def test_bad_input_is_one_clear_error(tmp_path):
    with pytest.raises(ConformanceError, match="unknown backend 'metal'; refimpl judges: cpu, "):
        conformance.run("metal", out=tmp_path)
    with pytest.raises(ConformanceError, match="not a regular expression"):
        conformance.run("cpu", params="([", out=tmp_path)


def test_a_crash_is_the_backend_s_verdict_and_the_report_takes_it(tmp_path):
    pytest.importorskip("matplotlib", reason="the plot needs matplotlib (the notebooks extra)")
    crash = conformance._crash_record("MUL_MAT_ID(type_a=nvfp4)", "Vulkan0", -11)
    assert crash["verdict"] == "backend wrong" and crash["crash"] == "signal 11" and crash["err_backend"] == math.inf
    recs = [crash, judge(raw(op="MUL_MAT_ID"))]
    meta = {"backend": "vulkan", "device": "Vulkan0", "about": "x", "cpu": "x", "date": "d", "seconds": 1.0}
    text = write_report(recs, meta, tmp_path).read_text()
    assert "| MUL_MAT_ID | 2 | 1 | 1 |" in text and "signal 11" in text
    path = tmp_path / "c.jsonl"
    path.write_text(verdicts.to_json(crash) + "\n")
    assert read_cases(path)[0]["err_backend"] == math.inf


def test_a_case_without_a_result_in_time_is_killed_and_undecided(tmp_path):
    """--case-timeout: test-backend-ops that judges nothing for `limit` seconds is killed (a device that sits on
    one case for tens of minutes, as lavapipe did on a MUL_MAT), and the case is `undecided`, with the reason."""
    import subprocess
    import sys
    import time
    raw = tmp_path / "raw.jsonl"
    raw.write_text(json.dumps({"op": "ADD"}) + "\n")
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    t0 = time.monotonic()
    assert conformance._follow(proc, raw, lambda m: None, t0, limit=1.0) is True
    assert proc.returncode is not None and time.monotonic() - t0 < 30
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    assert conformance._follow(done, raw, lambda m: None, t0, limit=60.0) is False
    rec = conformance._timeout_record("MUL_MAT(type_a=nvfp4,n=6)", "Vulkan0", 900.0)
    assert rec["verdict"] == "undecided" and rec["timeout"] == 900.0 and "900 s" in rec["reason"]
    meta = {"backend": "vulkan", "device": "Vulkan0", "about": "x", "cpu": "x", "date": "d", "seconds": 1.0}
    assert "| MUL_MAT | 1 | 0 | 0 | 0 | 0 | 1 |" in write_report([rec], meta, tmp_path).read_text()


def test_case_timeout_flag_is_checked(capsys):
    from refimpl.__main__ import main
    with pytest.raises(SystemExit) as e:
        main(["conformance", "-b", "cpu", "--case-timeout", "0", "-o", "ADD"])
    assert e.value.code == 2 and "--case-timeout wants a number > 0" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["conformance", "-b", "cpu", "--jobs", "0", "-o", "ADD"])
    assert e.value.code == 2 and "--jobs wants a number >= 1, not '0'" in capsys.readouterr().err


FAKE_TBO = r'''#!PYTHON
"""A stand-in for test-backend-ops: `support` lists N cases of ADD; `test` judges its selection in order (one
line each into GGML_JUDGE_OUT) and dies with SIGSEGV on the case named by CRASH_ON (with SIGABRT on the case
named by CRASH_AFTER_OTHERS, unless it is the first case it runs: a heap corrupted by earlier cases); the cases
named by REFUSE it lists as supported but refuses when it runs them, as ggml-vulkan does with CONV_1D_DW's bf16
kernels (on any device but CPU, which runs them; REFUSE=* refuses every case); with PIDS set it leaves a file
named by its pid there, and it takes SLOW seconds a case."""
import os, signal, sys
N = int(os.environ["FAKE_N"])
cases = [f"ADD(type=f32,ne=[{i},1,1,1],nr=[1,1,1,1],nf=1,perm1=0,src_overlap=0,padding={'x' * 40})"
         for i in range(N)]
args = sys.argv[1:]
sel = args[args.index("-o") + 1] if "-o" in args else "ADD"
if args[0] == "support":
    print("backend_name,op_name,op_params,supported")
    for c in cases:
        print(f'Vulkan0,ADD,"{c[4:-1]}",1')
    sys.exit(0)
todo = cases if sel == "ADD" else [c if c.endswith(")") else c + ")" for c in sel.split("),")]
if os.environ.get("PIDS"):                      # where it says it runs; SLOW: seconds it takes per case
    open(os.path.join(os.environ["PIDS"], str(os.getpid())), "w").close()
with open(os.environ["GGML_JUDGE_OUT"], "a") as f:
    for c in todo:
        __import__("time").sleep(float(os.environ.get("SLOW", 0)))
        refused = os.environ.get("REFUSE", "")
        if (refused == "*" or c in refused.split(";")) and args[args.index("-b") + 1] != "CPU":
            print(f"  {c}: not supported [Vulkan0] ", flush=True)
            continue
        if c == os.environ.get("CRASH_ON") or (c == os.environ.get("CRASH_AFTER_OTHERS") and c != todo[0]):
            f.flush()
            os.kill(os.getpid(), signal.SIGABRT if os.environ.get("CRASH_AFTER_OTHERS") else signal.SIGSEGV)
        f.write('{"op": "ADD", "case": "%s", "backend": "%s", "budget": 1e-7, "cpu_supported": true, '
                '"err_backend": 0, "err_cpu": 0, "err_backend_cpu": 0}\n' % (c, args[args.index("-b") + 1]))
        f.flush()
'''


class _NoServer:
    """In place of refimpl's servers: the stand-in test-backend-ops computes nothing on them."""

    def __init__(self, numerics, log):
        self.endpoint = f"127.0.0.1:{numerics}"

    def stop(self):
        pass


def _fake_bin(tmp_path):
    """A build directory whose test-backend-ops is FAKE_TBO."""
    import stat
    import sys
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "test-backend-ops"
    fake.write_text(FAKE_TBO.replace("PYTHON", sys.executable))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    return bindir


def test_a_case_the_process_died_on_runs_alone_and_is_judged_there(tmp_path):
    """ggml-vulkan on lavapipe aborts ("malloc(): unaligned tcache chunk") on whichever case follows the heap's
    corruption: MUL_MAT_W4A8(type_a=mxfp4,...,m=32,n=32) died in a run of 46 cases and passes alone. The judge
    runs the case it died on once more alone: judged on that run when it ends (its record says how the run died
    there), `backend wrong` only when it dies alone too."""
    bindir = _fake_bin(tmp_path)
    case = "ADD(type=f32,ne=[{}," + "1,1,1],nr=[1,1,1,1],nf=1,perm1=0,src_overlap=0,padding=" + "x" * 40 + ")"
    n = 30
    for mode, name in (("CRASH_AFTER_OTHERS", "in-sequence"), ("CRASH_ON", "always")):
        out = tmp_path / name
        out.mkdir()
        env = {**os.environ, "FAKE_N": str(n), mode: case.format(10)}
        raws, crashes, unsupported, _ = conformance._pass(bindir, "Vulkan0", "ADD", None, env, out, "",
                                                          lambda msg: None, 0.0)
        cases = [r["case"] for r in raws]
        if mode == "CRASH_AFTER_OTHERS":
            assert crashes == [] and sorted(cases) == sorted(case.format(i) for i in range(n))
            (rec,) = [r for r in raws if r["case"] == case.format(10)]
            assert rec["crash_in_sequence"] == "signal 6"
            assert judge(rec)["verdict"] == "agree" and judge(rec)["crash_in_sequence"] == "signal 6"
            assert sum("crash_in_sequence" in r for r in raws) == 1
            meta = {"backend": "vulkan", "device": "Vulkan0", "about": "x", "cpu": "x", "date": "d", "seconds": 1.0}
            report = write_report([judge(r) for r in raws], meta, out).read_text()
            assert "## Where test-backend-ops died after earlier cases" in report
            assert f"| `{case.format(10)}` | signal 6 | agree |" in report
        else:
            assert [c["case"] for c in crashes] == [case.format(10)] and len(cases) == n - 1
            assert crashes[0]["crash"] == "signal 11" and "again when run alone" in crashes[0]["reason"]


def test_the_cases_after_a_crash_go_on_in_batches_a_command_line_can_hold(tmp_path):
    """After a crash the judge reruns test-backend-ops on the cases after the one it died on, named one by one
    in -o: 3,000 cases are ~300 KB, over Linux's 128 KiB for one argument ("Argument list too long", which
    ended a Vulkan run). Every case is judged once, in batches, the crashed one recorded as the backend's; a
    case that `support` lists but the run refuses is neither run again nor blamed for the crash after it."""
    bindir = _fake_bin(tmp_path)
    n = 3000
    case = "ADD(type=f32,ne=[{},1,1,1],nr=[1,1,1,1],nf=1,perm1=0,src_overlap=0,padding=" + "x" * 40 + ")"
    crash_on, refused = case.format(10), [case.format(7), case.format(2000)]
    env = {**os.environ, "FAKE_N": str(n), "CRASH_ON": crash_on, "REFUSE": ";".join(refused)}
    raws, crashes, unsupported, _ = conformance._pass(bindir, "Vulkan0", "ADD", None, env, tmp_path, "",
                                                      lambda m: None, 0.0)
    cases = [r["case"] for r in raws]
    assert len(cases) == n - 3 and len(set(cases)) == n - 3 and crash_on not in cases
    # the crash is the case it died on, not the refused one listed before it
    assert [c["case"] for c in crashes] == [crash_on] and crashes[0]["crash"] == "signal 11"
    assert len(",".join(cases)) > 2 * conformance._MAX_SELECTION and unsupported == sorted(refused)


def test_a_run_split_over_several_processes_judges_every_case_once_in_order(tmp_path, monkeypatch):
    """--jobs N: the cases are dealt round-robin to N test-backend-ops processes run at once, each with servers
    of its own; the records come back once each, in test-backend-ops' order, with the crash in one share and
    the cases a share refuses as with one process."""
    monkeypatch.setattr(conformance, "_Server", _NoServer)
    bindir = _fake_bin(tmp_path)
    n = 300
    case = "ADD(type=f32,ne=[{},1,1,1],nr=[1,1,1,1],nf=1,perm1=0,src_overlap=0,padding=" + "x" * 40 + ")"
    todo = [case.format(i) for i in range(n)]
    crash_on, refused = case.format(10), [case.format(7), case.format(200)]
    env = {**os.environ, "FAKE_N": str(n), "CRASH_ON": crash_on, "REFUSE": ";".join(refused)}
    raws, crashes, unsupported = conformance._split_pass(bindir, "Vulkan0", todo, env, tmp_path, "",
                                                         lambda m: None, 0.0, 60.0, True, 3)
    assert [r["case"] for r in raws] == [c for c in todo if c != crash_on and c not in refused]
    assert [c["case"] for c in crashes] == [crash_on] and unsupported == sorted(refused)
    assert sorted(p.name for p in tmp_path.glob("raw*.jsonl")) == ["raw-1.jsonl", "raw-2.jsonl", "raw-3.jsonl"]


def test_the_summary_line_counts_each_case_the_backend_cannot_run_once(tmp_path, monkeypatch):
    """A case the backend cannot run is counted once: judged on ggml-cpu alone (a record), or left unjudged
    (`unsupported`: the cases the second pass could not run either). With --jobs 2 the second pass's
    leftovers were dropped and the first pass's list returned, so a Vulkan run with 4 such cases, all judged
    on ggml-cpu alone, said 8."""
    monkeypatch.setattr(conformance, "_Server", _NoServer)
    bindir = _fake_bin(tmp_path)
    case = "ADD(type=f32,ne=[{},1,1,1],nr=[1,1,1,1],nf=1,perm1=0,src_overlap=0,padding=" + "x" * 40 + ")"
    refused = [case.format(3), case.format(5)]
    monkeypatch.setattr(conformance, "_case_list", lambda *a: [(case.format(i), case.format(i) not in refused)
                                                                for i in range(8)])
    monkeypatch.setenv("FAKE_N", "8")
    be = conformance.BACKENDS["vulkan"]
    for jobs in (1, 2):
        monkeypatch.setenv("REFUSE", ";".join(refused))        # the backend refuses them, ggml-cpu runs them
        records, left = conformance._judge_passes(bindir, be, "ADD", None, dict(os.environ), tmp_path,
                                                  lambda m: None, 0.0, 60.0, False, True, jobs)
        alone = [r["case"] for r in records if r.get("backend_supported") is False]
        assert left == [] and len(records) == 8 and sorted(alone) == sorted(refused), (jobs, left, len(records))
    s = dict(verdicts.summarize([judge(raw(op="ADD")), judge(conformance._cpu_alone(raw(op="ADD", case="ADD(x)"),
                                                                                     "Vulkan0"))]),
             seconds=1.0, out="d", unsupported=0)
    assert "0 checked for the first time (ggml-cpu cannot run them); 1 the backend cannot run (1 of them judged" \
        in conformance.summary_line("vulkan", s)


def test_a_thousand_cases_the_backend_refuses_go_to_ggml_cpu_in_batches(tmp_path, monkeypatch):
    """The second pass names the cases the backend cannot run one by one; 1,200 of them (as many as ggml-vulkan
    refuses of CONV_2D) are ~160 KB, over Linux's 128 KiB for one argument, so they go in -o batches as the
    cases after a crash do, with one process as with several."""
    monkeypatch.setattr(conformance, "_Server", _NoServer)
    bindir = _fake_bin(tmp_path)
    n = 1200
    monkeypatch.setenv("FAKE_N", str(n))
    monkeypatch.setenv("REFUSE", "*")
    records, left = conformance._judge_passes(bindir, conformance.BACKENDS["vulkan"], "ADD", None,
                                              dict(os.environ), tmp_path, lambda m: None, 0.0, 60.0, False, True, 1)
    assert left == [] and len(records) == n and all(r.get("backend_supported") is False for r in records)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_an_interrupted_run_ends_its_processes_and_its_threads(tmp_path, monkeypatch, sig):
    """Ctrl-C (or SIGTERM, which `run` turns into the same) during a run split over two processes: the judge
    ends both test-backend-ops processes and both refimpl servers and returns at once. Before, the main thread
    left while the shares' threads went on running test-backend-ops to the end of their cases (a Vulkan run:
    hours), and SIGTERM left the servers running."""
    import signal
    import threading
    import time
    bindir = _fake_bin(tmp_path)
    pids = tmp_path / "pids"
    pids.mkdir()
    case = "ADD(type=f32,ne=[{},1,1,1],nr=[1,1,1,1],nf=1,perm1=0,src_overlap=0,padding=" + "x" * 40 + ")"
    todo = [case.format(i) for i in range(8)]
    env = {**os.environ, "FAKE_N": "8", "PIDS": str(pids), "SLOW": "120"}
    servers = []
    real_server = conformance._Server

    def server(numerics, log):
        servers.append(real_server(numerics, log))
        return servers[-1]
    monkeypatch.setattr(conformance, "_Server", server)

    def interrupt_when_both_run():
        deadline = time.monotonic() + 120
        while len(list(pids.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        os.kill(os.getpid(), getattr(signal, sig))
    threading.Thread(target=interrupt_when_both_run, daemon=True).start()
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt), conformance._sigterm_interrupts():
        conformance._split_pass(bindir, "Vulkan0", todo, env, tmp_path, "", lambda m: None, 0.0, 600.0, False, 2)
    tbo = [int(p.name) for p in pids.iterdir()]
    assert len(tbo) == 2 and len(servers) == 2, (tbo, servers)
    assert time.monotonic() - t0 < 90 and not [p for p in tbo if _alive(p)]
    assert all(s.proc.poll() is not None for s in servers)
    assert not [t for t in threading.enumerate() if t.name.startswith("conformance-") and t.is_alive()]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
