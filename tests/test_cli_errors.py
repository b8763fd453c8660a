"""User errors on the command line, through the installed `refimpl` command: one `refimpl: error: ...` line on
stderr naming the file or flag, exit status 1 (2 for usage errors), no traceback; Ctrl-C exits 130."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.models.tiny import write_tiny_llama

pytestmark = pytest.mark.property

REFIMPL = Path(sys.executable).with_name("refimpl")


def refimpl(*args, env=None, timeout=300):
    assert REFIMPL.exists(), f"the installed command {REFIMPL} is missing (pip install -e .)"
    return subprocess.run([str(REFIMPL), *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, **(env or {})))


def assert_one_error_line(r, *words, status=1):
    err = r.stderr.strip().splitlines()
    assert r.returncode == status, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    assert err and err[-1].startswith("refimpl: error: "), r.stderr[-2000:]
    assert not [line for line in err[:-1] if "error" in line.lower()], r.stderr    # one error line
    for w in words:
        assert str(w) in err[-1], (w, err[-1])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("cli") / "tiny.gguf")


@pytest.mark.parametrize("cmd", [["inspect"], ["generate", "-m"], ["chat", "-m"], ["embed", "-m"]])
def test_a_missing_file(cmd, tmp_path):
    missing = tmp_path / "nothing-here.gguf"
    assert_one_error_line(refimpl(*cmd, missing, *(["hello"] if cmd[0] == "embed" else [])), missing)


def test_a_directory_or_a_path_through_a_file(tmp_path):
    assert_one_error_line(refimpl("inspect", tmp_path), tmp_path)
    f = tmp_path / "plain.txt"
    f.write_text("x")
    assert_one_error_line(refimpl("generate", "-m", f / "model.gguf", "-p", "hi"), f / "model.gguf")


def test_an_unreadable_file(tmp_path):
    """Mode 000 where the tests run unprivileged; as root, who reads every file, a name whose target is gone."""
    f = tmp_path / "locked.gguf"
    if os.geteuid() == 0:
        f.symlink_to(tmp_path / "gone.gguf")
    else:
        f.write_bytes(b"GGUF" + bytes(60))
        f.chmod(0)
    assert_one_error_line(refimpl("inspect", f), f)


def test_a_file_that_is_not_a_model(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("root:x:0:0:root:/root:/bin/bash\n" * 20)
    assert_one_error_line(refimpl("generate", "-m", f, "-p", "hi"), f)


def test_a_bad_gguf(tmp_path):
    f = tmp_path / "bad.gguf"
    f.write_bytes(b"GGUF" + np.uint32(3).tobytes() + np.uint64(1 << 40).tobytes() + np.uint64(0).tobytes())
    for cmd in (["inspect", f], ["generate", "-m", f, "-p", "hi"]):
        assert_one_error_line(refimpl(*cmd), f)


def test_an_unsupported_architecture(tmp_path):
    import gguf as gguf_py
    f = tmp_path / "other.gguf"
    w = gguf_py.GGUFWriter(str(f), "no-such-arch")
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert_one_error_line(refimpl("generate", "-m", f, "-p", "hi"), "no-such-arch")


def test_a_missing_optional_package_names_the_pip_command(tmp_path):
    shadow = tmp_path / "shadow" / "hypothesis"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'hypothesis'\", "
                                        "name='hypothesis')\n")
    r = refimpl("compare", "--op", "add", env={"PYTHONPATH": str(tmp_path / "shadow")})
    assert_one_error_line(r, "hypothesis", "pip install 'refimpl[test]'")


def test_a_missing_optional_package_anywhere_names_its_extra(tmp_path, tiny):
    """A command whose code imports an optional package that is missing: jinja2, for a chat template."""
    from tests.test_extras import _with_template
    model = _with_template(tiny, tmp_path / "chat.gguf")
    shadow = tmp_path / "shadow" / "jinja2"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'jinja2'\", name='jinja2')\n")
    r = refimpl("generate", "-m", model, "-p", "hi", "--chat-format", "-n", "1", "-b", "numpy",
                env={"PYTHONPATH": str(tmp_path / "shadow")})
    assert_one_error_line(r, "jinja2", "pip install 'refimpl[tokenizers]'")


def test_a_full_kv_cache(tiny):
    assert_one_error_line(refimpl("generate", "-m", tiny, "-p", "a b c d e f g h i j", "--ctx-size", "4",
                                  "-b", "numpy"), "KV cache", "--ctx-size")


@pytest.mark.parametrize("flag, value", [("--top-p", "2"), ("--temperature", "-1"), ("-j", "0"),
                                         ("--ctx-size", "zero"), ("--min-p", "1.5"), ("--backend", "gpu")])
def test_a_bad_flag_value(flag, value, tiny):
    assert_one_error_line(refimpl("generate", "-m", tiny, flag, value), flag.lstrip("-")[:5], status=2)


@pytest.mark.parametrize("args", [["embed", "--batch-size", "0", "hello"], ["embed", "--batch-size", "-1", "a"],
                                  ["demo", "--rows", "0"]])
def test_a_bad_count(args):
    """A count that would silently give nothing (embed --batch-size 0 printed no vectors and exited 0)."""
    assert_one_error_line(refimpl(*args), args[1].lstrip("-"), status=2)


def test_an_unknown_flag():
    assert_one_error_line(refimpl("generate", "--no-such-flag"), "--no-such-flag", status=2)


def test_ctrl_c_exits_130_without_a_traceback(tiny):
    """Ctrl-C at chat's prompt: exit status 130, no traceback."""
    import select
    p = subprocess.Popen([str(REFIMPL), "chat", "-m", tiny, "-b", "numpy"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        seen = b""
        deadline = time.time() + 120
        while b"> " not in seen and time.time() < deadline and p.poll() is None:
            if select.select([p.stdout], [], [], 1.0)[0]:
                seen += os.read(p.stdout.fileno(), 4096)
        assert b"> " in seen, (seen, p.poll())
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    err = err.decode()
    assert p.returncode == 130, (p.returncode, err[-2000:])
    assert "Traceback" not in err, err[-2000:]


def test_the_seeds_flags_with_equals_repeat_a_run(tiny):
    """-r/--seed repeats a sampled run; without it the seed (the current time) is printed with the flag that
    repeats it; --opt=value forms; -n -1 stops at the context's end (--ctx-size)."""
    args = ["generate", "-m", tiny, "-b", "numpy", "--temperature=0.9", "--steps=6"]
    a, b = refimpl(*args, "-r", "7"), refimpl(*args, "--seed=7")
    assert a.returncode == b.returncode == 0 and a.stdout == b.stdout and a.stdout, (a.stderr, b.stderr)
    c = refimpl(*args)
    seed = [line for line in c.stderr.splitlines() if line.startswith("[seed ")]
    assert c.returncode == 0 and len(seed) == 1, c.stderr
    n = int(seed[0].split()[1].rstrip(":"))
    assert refimpl(*args, "-r", n).stdout == c.stdout
    d = refimpl("generate", "-m", tiny, "-b", "numpy", "-p", "a b", "-n", "-1", "--ctx-size", "12")
    assert d.returncode == 0, d.stderr
    stats = d.stderr.strip().splitlines()[-1]
    assert stats.startswith("[") and "backend numpy, numerics exact" in stats, stats
    assert int(stats[1:].split()[0]) <= 12, stats
