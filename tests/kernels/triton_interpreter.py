"""Running kiln's Triton kernels on CPU in tests: Triton picks its interpreter (TRITON_INTERPRET=1)
when it is first imported, which torch._dynamo does early in any test process; so a test module
with kernel tests marks them `interpreted` and runs itself again in a subprocess started with the
variable set (`rerun_interpreted`), where only those run (selected by their `interpreted` marker:
the module's other tests already ran in this process, and a second run under the interpreter
would only repeat them, compiles and all). The first such module to ask runs every
module of the session that has kernel tests in one subprocess (one interpreter start, not one per
module) and each module's `test_under_interpreter` then reports its own module's outcome. A
session without pytest-xdist starts that subprocess as soon as its tests are collected
(tests/conftest.py calls `start_early`): it runs on the second core beside the session's first
tests, whose own processes are mostly single-threaded, instead of after them."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]  # pytest's rootdir: junit names tests from it
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
MARKER = "interpreted"
XDIST_WORKER = "PYTEST_XDIST_WORKER" in os.environ
"""A pytest-xdist worker collects every test but runs only its share: it starts no early run; every
module's `test_under_interpreter` is sent to one worker (tests/conftest.py's scheduler), which runs
the subprocess for them all when the first asks."""


def _scalar_indices() -> None:
    """Triton's interpreter holds a scalar loaded from memory as a 1-element array, which numpy 2
    refuses to turn into an index: a kernel whose loop bounds are read from memory (`range(lo, hi)`,
    as kiln.kernels.triton_decode's) fails under the interpreter only. Its tensors index by their
    one element instead."""
    from triton.runtime import interpreter

    patch = getattr(interpreter, "_patch_lang_tensor", None)
    if patch is None:  # another Triton: its interpreter is left as it is
        return

    def patched(tensor, scope) -> None:
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patched


if INTERPRETED:
    _scalar_indices()


def interpreted(test):
    """Mark a kernel test: skipped here, run (and selected by MARKER) in the interpreter subprocess."""
    skip = pytest.mark.skipif(not INTERPRETED, reason="runs in its module's interpreter subprocess")
    return getattr(pytest.mark, MARKER)(skip(test))


not_in_subprocess = pytest.mark.skipif(INTERPRETED, reason="this is the interpreter subprocess")

_OUTCOMES: dict[str, str] = {}
"""Test file -> what went wrong in its interpreter run ("" when every test passed)."""


def _session_files() -> set[str]:
    """The test modules imported in this process that rerun themselves here (pytest imports every
    collected module before the first test runs)."""
    return {module.__file__ for module in list(sys.modules.values())
            if getattr(module, "rerun_interpreted", None) is rerun_interpreted
            and hasattr(module, "test_under_interpreter") and getattr(module, "__file__", None)}


def _outcomes(files: list[str], report: Path, output: str) -> dict[str, str]:
    """Per file: "" when its tests all passed (none skipped), else its failures (or the run's output)."""
    try:
        cases = list(ET.parse(report).getroot().iter("testcase"))
    except (OSError, ET.ParseError):
        return {f: f"no report from the interpreter run:\n{output}" for f in files}
    outcomes = {}
    for f in files:
        module = ".".join(Path(f).resolve().relative_to(ROOT).with_suffix("").parts)
        mine = [c for c in cases if c.get("classname", "") == module or c.get("classname", "").startswith(module + ".")]
        bad = [f"{c.get('name')}: {child.tag} {child.get('message', '')}\n{child.text or ''}"
               for c in mine for child in c if child.tag in ("failure", "error", "skipped")]
        outcomes[f] = ("no test ran" if not mine else "\n".join(bad)[-6000:])
    return outcomes


class _Run:
    """The interpreter subprocess of `files`, its output and junit report in a temporary directory."""

    def __init__(self, files: list[str]) -> None:
        self.files = files
        self.tmp = tempfile.TemporaryDirectory(prefix="kiln-interpreted-")
        self.report = Path(self.tmp.name) / "report.xml"
        self.output = Path(self.tmp.name) / "output.txt"
        env = {**os.environ, "TRITON_INTERPRET": "1"}
        with open(self.output, "w") as out:  # a file, not a pipe: nobody reads it while the session runs
            self.proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *files,
                                          "-m", MARKER, f"--junitxml={self.report}"],
                                         env=env, stdout=out, stderr=subprocess.STDOUT, text=True)

    def outcomes(self) -> dict[str, str]:
        """Wait for the run (at most 10 minutes a file) and read each file's outcome."""
        try:
            self.proc.wait(timeout=600 * len(self.files))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        output = self.output.read_text(errors="replace")[-6000:]
        try:
            return _outcomes(self.files, self.report, output)
        finally:
            self.tmp.cleanup()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.tmp.cleanup()


_EARLY: list[_Run] = []
"""The run `start_early` started, until a test reads its outcomes."""


def start_early(files: list[str]) -> None:
    """Start the interpreter run of `files` (the modules whose `test_under_interpreter` the session
    collected) in the background; their tests read its outcomes when they run."""
    if files and not INTERPRETED and not _EARLY and not XDIST_WORKER:
        _EARLY.append(_Run(sorted(set(files))))


def stop_early() -> None:
    """End a background run no test waited for (the session stopped before them)."""
    while _EARLY:
        _EARLY.pop().stop()


def rerun_interpreted(test_file: str) -> None:
    """Run `test_file` under Triton's interpreter (with the session's other such files, once);
    fail with its output unless every one of its tests passed."""
    if test_file not in _OUTCOMES and _EARLY:
        _OUTCOMES.update(_EARLY.pop().outcomes())
    if test_file not in _OUTCOMES:
        files = sorted(({test_file} | _session_files()) - set(_OUTCOMES))
        _OUTCOMES.update(_Run(files).outcomes())
    assert not _OUTCOMES[test_file], _OUTCOMES[test_file]
