"""Running kiln's Triton kernels on CPU in tests: Triton picks its interpreter (TRITON_INTERPRET=1)
when it is first imported, which torch._dynamo does early in any test process; so a test module
with kernel tests marks them `interpreted` and runs itself again in a subprocess started with the
variable set (`rerun_interpreted`), where only those run."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
interpreted = pytest.mark.skipif(not INTERPRETED, reason="runs in its module's interpreter subprocess")
not_in_subprocess = pytest.mark.skipif(INTERPRETED, reason="this is the interpreter subprocess")


def rerun_interpreted(test_file: str) -> None:
    """Run `test_file` under Triton's interpreter; fail with its output unless every test passed."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test_file,
                          "-k", "not test_under_interpreter"], env=env, capture_output=True, text=True, timeout=600)
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""
    assert run.returncode == 0 and "skipped" not in summary, run.stdout[-4000:] + run.stderr[-2000:]
