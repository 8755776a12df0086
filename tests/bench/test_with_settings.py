"""benchmarks/with_settings.py: module settings applied before a kiln command runs, a bad setting
refused with exit 2 before anything runs, and serve.sh running its server through it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from tests.benchmark_scripts import load_script

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ws():
    return load_script("with_settings")


def test_settings_are_in_place_when_the_command_runs(ws, monkeypatch, capsys):
    """... and the environment a results file records names them."""
    from kiln.bench import formulas
    from kiln.monitor import env

    monkeypatch.setattr(formulas, "probe_value", 1, raising=False)
    monkeypatch.setattr(env, "APPLIED_SETTINGS", [])
    assert "module_settings" not in env.collect_env()
    seen = {}

    def run(args):
        seen["args"], seen["value"] = args, formulas.probe_value
        seen["recorded"] = env.collect_env().get("module_settings")
        return 0

    assert ws.main(["kiln.bench.formulas.probe_value=(512, True)", "--", "bench", "llm", "--batch", "1"], run=run) == 0
    assert seen == {"args": ["bench", "llm", "--batch", "1"], "value": (512, True),
                    "recorded": ["kiln.bench.formulas.probe_value=(512, True)"]}
    assert "kiln.bench.formulas.probe_value: 1 -> (512, True)" in capsys.readouterr().err


@pytest.mark.parametrize(("setting", "needle"), [
    ("kiln.bench.formulas.NO_SUCH_NAME=1", "has no 'NO_SUCH_NAME'"),
    ("kiln.no_such_module.X=1", "cannot be imported"),
    ("kiln.bench.formulas.decode_steps=os.system", "not a Python literal"),
    ("BALANCE", "not MODULE.NAME=VALUE"),
])
def test_a_bad_setting_exits_2_before_the_command(ws, capsys, setting, needle):
    ran = []
    assert ws.main([setting, "--", "env"], run=ran.append) == 2
    err = capsys.readouterr().err
    assert not ran and needle in err and len(err.strip().splitlines()) == 1, err


def test_without_the_separator_it_says_how_to_call_it(ws, capsys):
    assert ws.main(["kiln.bench.formulas.X=1"], run=lambda a: 0) == 2
    assert "usage" in capsys.readouterr().err


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_serve_sh_runs_kiln_through_it_with_kiln_settings(tmp_path):
    """serve.sh's CPU plumbing check with KILN_SETTINGS: the server starts through with_settings.py,
    which says what it set in the server's log."""
    env = {**os.environ, "OUT": str(tmp_path / "out"), "DEVICE": "cpu", "MODEL": "llama-tiny", "VOCAB": "512",
           "MAX_SEQ_LEN": "64", "PROMPT_LEN": "16", "MAX_TOKENS": "4", "BATCH_BUCKETS": "1,2", "MAX_BATCH": "2",
           "CONCURRENCY": "1", "OPEN_FRACTIONS": " ", "WARMUP_BUCKETS": "none", "DURATION_S": "1", "PART": "bf16",
           "PORT": str(_free_port()), "BUDGET_S": "200", "PART_S": "190", "PYTHON": sys.executable,
           "KILN_SETTINGS": "kiln.kernels.triton_decode.TARGET_PROGRAMS=128"}
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    done = subprocess.run(["bash", "benchmarks/serve.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    log = (tmp_path / "out" / "r" / "bf16.server.log").read_text()
    assert "with_settings.py: kiln.kernels.triton_decode.TARGET_PROGRAMS: 256 -> 128" in log, done.stdout + done.stderr
    assert '"concurrency": 1' in done.stdout and "exit 0 after SIGTERM" in done.stdout, done.stdout + done.stderr
