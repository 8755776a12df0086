"""Dependency noise (kiln.noise): the rule, and where the messages go (the log, not the console)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kiln import noise
from kiln.noise import NoiseLog, filtered_fds, is_noise

SITE = "/usr/lib/python3.12/site-packages/transformers/utils/generic.py"


@pytest.mark.parametrize(("kwargs", "expected"), [
    (dict(text="`torch.utils._pytree._register_pytree_node` is deprecated.", category=FutureWarning,
          filename=SITE), True),
    (dict(text="x is deprecated", category=DeprecationWarning, filename="/venv/lib/dist-packages/timm/a.py"), True),
    # The user's own code, or kiln's: their business.
    (dict(text="x is deprecated", category=FutureWarning, filename="/home/me/my_models.py"), False),
    # Not a deprecation: a dependency's UserWarning may matter (kept on the console).
    (dict(text="TF32 is off", category=UserWarning, filename=SITE), False),
    (dict(text="Skipping import of cpp extensions due to incompatible torch version.", logger="torchao"), True),
    (dict(text="Failed to load /x/torchao/_C.abi3.so: undefined symbol", logger="torchao.ops"), True),
    (dict(text="Skipping import of cpp extensions", logger="kiln"), False),
    (dict(text="loss went NaN", logger="transformers.trainer"), False),
    (dict(text="USDT: probe registered"), True),
    (dict(text="  USDT: x"), True),
    (dict(text="step 1/30 | loss 2.0"), False),
])
def test_the_rule(kwargs, expected):
    assert is_noise(**kwargs) is expected


def test_buffered_until_a_directory_then_appended_there(tmp_path):
    log = NoiseLog()
    log.write("first")
    assert not (tmp_path / noise.LOG_NAME).exists()
    path = log.attach(tmp_path)
    log.write("second\n")
    assert path.read_text() == "first\nsecond\n" and log.count == 2
    assert log.flush_unattached() is None


def test_without_a_directory_the_messages_go_to_one_temp_file_replaced_each_time():
    log = NoiseLog()
    log.write("a dependency said something")
    path = log.flush_unattached()
    log.write("and then something else")
    assert log.flush_unattached() == path  # the same file: nothing piles up in the temp directory
    try:
        assert path.name.endswith(noise.LOG_NAME) and path.read_text() == "and then something else\n"
    finally:
        path.unlink()


def test_a_kiln_command_keeps_them_off_the_console_and_in_its_output_dir(tmp_path):
    """In a fresh process as the CLI sets it up: warnings and log records of dependencies go to
    dependencies.log in the output directory, the user's own stay on stderr."""
    script = f"""
import argparse, logging, warnings
from kiln.cli.main import _keep_noise, _setup_logging
_setup_logging()
warnings.simplefilter("always")
warnings.warn_explicit("`_register_pytree_node` is deprecated", FutureWarning, {SITE!r}, 10)
warnings.warn_explicit("your own deprecation", FutureWarning, "/home/me/train.py", 3)
logging.getLogger("torchao").warning("Skipping import of cpp extensions due to incompatible torch version")
logging.getLogger("torchao").warning("quantized 12 layers")
import enum, torch.utils._pytree as pytree
class Kind(enum.Enum):  # what torchao registers on import: torch logs a deprecation through its own handler
    A = 1
    def __eq__(self, other):
        return self is other
    def __hash__(self):
        return 1
pytree.register_constant(Kind)
_keep_noise(argparse.Namespace(output_dir={str(tmp_path)!r}))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONWARNINGS": ""})
    assert proc.returncode == 0, proc.stderr
    assert "your own deprecation" in proc.stderr and "quantized 12 layers" in proc.stderr
    assert "_register_pytree_node" not in proc.stderr and "Skipping import" not in proc.stderr
    assert "register_constant" not in proc.stderr
    kept = (tmp_path / noise.LOG_NAME).read_text()
    assert "_register_pytree_node" in kept and "torchao WARNING: Skipping import of cpp extensions" in kept
    assert "torch.utils._pytree WARNING: <enum 'Kind'> is an Enum subclass" in kept


def test_native_usdt_lines_leave_the_console_and_the_rest_stays(capfd, monkeypatch):
    kept = NoiseLog()
    monkeypatch.setattr(noise, "NOISE", kept)
    with filtered_fds():
        os.write(2, b"USDT: probe kineto registered\n")
        os.write(2, b"a real error from native code\n")
        os.write(1, b"stdout line\n")
        print("python line", file=sys.stderr, flush=True)
    out, err = capfd.readouterr()
    assert "USDT" not in err and "a real error from native code" in err and "python line" in err
    assert out == "stdout line\n"
    assert kept.count == 1


def test_keep_flushes_per_command(tmp_path, monkeypatch, capsys):
    kept = NoiseLog()
    monkeypatch.setattr(noise, "NOISE", kept)
    kept.write("during command one")
    assert noise.keep(tmp_path) == tmp_path / noise.LOG_NAME
    kept.write("during command two, which has no output directory")
    path = noise.keep(None)
    try:
        assert (tmp_path / noise.LOG_NAME).read_text() == "during command one\n"  # not appended to one's dir
        assert path.read_text() == "during command two, which has no output directory\n"
        assert f"kiln: 1 message(s) from dependencies kept in {path} (replaced" in capsys.readouterr().err
    finally:
        path.unlink()
    assert noise.keep(None) is None  # nothing filtered: nothing said


def test_a_command_starts_with_an_empty_log(tmp_path, monkeypatch, capsys):
    """What was filtered before a command (earlier work in the same process: a notebook, a test's
    fixtures) is not that command's: its bad-input refusal stays one line."""
    from kiln.cli.main import main

    kept = NoiseLog()
    monkeypatch.setattr(noise, "NOISE", kept)
    kept.write("left over from before the command")
    assert main(["report", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "does not exist" in err[0], err
