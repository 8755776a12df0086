"""Shared test helpers. Tests run on CPU, single-threaded where it keeps them deterministic."""

from __future__ import annotations

import os
import tempfile

import pytest
from tests.kernels.triton_interpreter import start_early, stop_early

# Two cores, several pytest workers at most: keep intra-op threads low so timings don't matter
# and results do not depend on the machine's load.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# kiln's secret key (kiln.signing) in a throwaway dir, not the user's ~/.config/kiln.
os.environ.setdefault("KILN_CONFIG_DIR", tempfile.mkdtemp(prefix="kiln-test-config-"))


@pytest.fixture
def tiny_overrides() -> list[str]:
    """A seed-MLP run small enough for a unit test (a fraction of a second per step)."""
    return [
        "model.kwargs.hidden_size=32",
        "model.kwargs.num_layers=2",
        "model.kwargs.num_classes=4",
        "model.kwargs.dropout=0.0",
        "data.batch_size=16",
        "data.synthetic_samples=256",
        "training.steps=30",
        "training.log_interval=5",
        "training.device=cpu",
        "metrics.console=false",
        "metrics.tensorboard=false",
    ]


@pytest.fixture
def bad_input(capsys):
    """`bad_input(argv, needles)`: `kiln ARGV` exits 2 with one line on stderr naming every needle
    (argparse's own usage errors exit from parse_args, also with 2)."""
    from kiln.cli.main import main

    def check(argv: list[str], needles: list[str]) -> str:
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
        err = capsys.readouterr().err.strip()
        assert code == 2, err
        assert len(err.splitlines()) == 1, err
        for needle in needles:
            assert needle in err
        return err

    return check


def pytest_configure(config):
    # tests/kernels/triton_interpreter.py: the interpreter subprocess selects its tests with `-m interpreted`.
    config.addinivalue_line("markers", "interpreted: a Triton kernel test, run in the TRITON_INTERPRET=1 subprocess")


def pytest_collection_finish(session):
    # tests/kernels/triton_interpreter.py: the Triton interpreter run starts now, beside the first tests.
    start_early([str(item.path) for item in session.items if item.name == "test_under_interpreter"])


def pytest_sessionfinish(session, exitstatus):
    stop_early()


def pytest_xdist_make_scheduler(config, log):
    """The README's `-n 2` runs: each test file's tests go to one worker (a module's fixtures are set up
    once, not once per worker: some launch ranks or a server), and every `test_under_interpreter` to the
    same worker, so one Triton interpreter subprocess serves them all (tests/kernels/triton_interpreter.py).
    A scheduler rather than `xdist_group` marks: `--dist loadgroup` does not group under pytest 9.2
    (pytest-dev/pytest-xdist#1386)."""
    from xdist.scheduler import LoadScopeScheduling

    class ByFile(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return INTERPRETER_SCOPE if nodeid.endswith("::test_under_interpreter") else nodeid.split("::", 1)[0]

    return ByFile(config, log)


INTERPRETER_SCOPE = "triton-interpreter"
