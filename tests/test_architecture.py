"""The rules of docs/architecture.md that no other test checks, each named there next to its rule.

- files stay under ~400 lines, no two modules share a file name, and every package has its tests/<area>/ folder;
- model code is single-device: kiln.models and kiln.llm.model import nothing that makes a model
  parallel, compiled, cast or kernel-swapped;
- one timing helper: only the modules listed here read a clock themselves, each for a wall time
  that no comparison ranks;
- every benchmark script writes through `write_results`, except the ones architecture.md lists;
- closed config choices are `Literal` fields: the `str` fields left are open values.
"""

from __future__ import annotations

import ast
import re
import typing
from pathlib import Path

from kiln.config import Config

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "kiln"
ARCHITECTURE = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")

MAX_LINES = 420
""""Files under ~400 lines": the largest module may run a little over, never far."""


def _modules() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def test_files_stay_under_about_400_lines():
    long = {str(p.relative_to(SRC)): n for p in _modules() if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"split these modules (one concern each): {long}"


PLUGIN_FILES = ("peer.py",)
"""File names a plug-in folder repeats by design: every peer folder under bench/peers/ has its
peer.py (docs/extension.md), as every model of torchtitan has its model.py."""


def test_no_two_modules_share_a_file_name():
    names: dict[str, list[str]] = {}
    for p in _modules():
        if p.name != "__init__.py" and p.name not in PLUGIN_FILES:
            names.setdefault(p.name, []).append(str(p.relative_to(SRC)))
    repeated = {name: paths for name, paths in names.items() if len(paths) > 1}
    assert not repeated, f"a file name says what the module is, once: rename one of {repeated}"


def test_every_package_has_its_tests_folder():
    packages = sorted(p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    missing = [name for name in packages if not (ROOT / "tests" / name).is_dir()]
    assert not missing, f"tests mirror modules: add tests/<area>/ for {missing}"


# --------------------------------------------------------------------------- model code is single-device

MODEL_CODE = sorted((SRC / "models").rglob("*.py")) + [SRC / "llm" / "model.py"]
APPLIED_FROM_OUTSIDE = ("torch.distributed", "kiln.distributed", "kiln.compile", "kiln.precision", "kiln.llm.kernels",
                        "kiln.llm.quant", "kiln.train", "kiln.kernels", "triton")
"""What is applied to a built model from outside: a model module imports none of it."""


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def test_model_code_imports_nothing_applied_from_outside():
    found = {str(p.relative_to(SRC)): sorted(n for n in _imports(p) if n.startswith(APPLIED_FROM_OUTSIDE))
             for p in MODEL_CODE}
    assert not {k: v for k, v in found.items() if v}, found


# --------------------------------------------------------------------------- one timing helper

CLOCK = re.compile(r"perf_counter\(|Event\(enable_timing")
OWN_CLOCKS = {
    "src/kiln/timing.py": "the helper itself",
    "src/kiln/train/meter.py": "a log interval's wall time and the data wait, read at log steps only",
    "src/kiln/train/loop.py": "the wait for the next batch (the meter's data-wait figure)",
    "src/kiln/train/trainer.py": "the run's wall time for summary.json",
    "src/kiln/train/finish.py": "the run's wall time for summary.json",
    "src/kiln/train/capture.py": "how long the CUDA-graph capture took (logged once)",
    "src/kiln/profile/window.py": "the profiler windows' wall time (a training run's, kiln bench llm's decode and prefill)",
    "src/kiln/distributed/sync_timing.py": "each rank's wait in collectives, CUDA events in stream order, read at log steps",
    "src/kiln/checkpoint/manager.py": "a save's duration for the checkpoint timeline, its stall on the step and total",
    "src/kiln/checkpoint/save_timing.py": "a long save's elapsed time in its progress line, and how long staging the "
                                          "state once before the first async save took",
    "src/kiln/diagnose/doctor.py": "how long each rung of the backend ladder took",
    "src/kiln/cli/data_cmd.py": "kiln data prepare's elapsed time in its progress line",
    "src/kiln/bench/llm/llm_bench.py": "the bench's elapsed time against its --end-by budget",
    "src/kiln/bench/peers/gpt_fast/peer.py": "a peer's time budget",
    "src/kiln/bench/peers/gpt_fast/process.py": "a peer's quantize time and time budget",
    "src/kiln/bench/peers/torchtitan/job_file.py": "a peer run's wall time and budget",
    "src/kiln/bench/peers/plain/plain_fsdp.py": "the hand-written FSDP2 loop's own step times (it imports no kiln, "
                                                "as torchtitan times its own steps)",
    "benchmarks/checkpoint_bench.py": "a save's blocking and completion time (one save, not a sample of a step)",
    "benchmarks/stage_probe.py": "one staging of a checkpoint's state (the stager synchronizes inside; a save's "
                                 "stall, not a sample of a step)",
    "benchmarks/save_probe.py": "one checkpoint write and its checksums (each a whole operation, not a sample of a step)",
    "benchmarks/failure_gpu.py": "each failure scenario's wall time",
    "benchmarks/fsdp_host_overhead.py": "host time inside FSDP2's own functions, measured by wrapping them",
    "benchmarks/plain_crosscheck.py": "written without kiln on purpose (the outside check of kiln's plain row)",
    "benchmarks/profile_modes.py": "each profile mode's wall time",
    "benchmarks/llm_real_text_check.py": "how long each check took (progress lines)",
    "benchmarks/rope_probe.py": "the compile and warm-up time (progress line)",
    "benchmarks/rows_bench.py": "its --budget-s",
    "benchmarks/serve_load.py": "a load generator's client-side arrival time of each streamed token (what a client "
                                "sees over HTTP; no device timing applies)",
    "benchmarks/int4_gemm_bench.py": "its --budget-s and progress lines",
    "src/kiln/serve/rows.py": "each decode step's device time and the device's idle time before it, for the "
                              "server's /metrics (CUDA events; what it reports under load, not a sample a "
                              "comparison ranks)",
}
"""Files that read a clock themselves, and what for: wall times of a whole phase, budgets and
progress, never the samples a comparison ranks (those go through kiln.timing)."""


def test_only_the_listed_modules_read_a_clock_themselves():
    files = [*_modules(), *sorted((ROOT / "benchmarks").glob("*.py"))]
    reading = {str(p.relative_to(ROOT)) for p in files if CLOCK.search(p.read_text(encoding="utf-8"))}
    assert reading - set(OWN_CLOCKS) == set(), "time samples through kiln.timing, or list the wall time here"
    assert set(OWN_CLOCKS) - reading == set(), "these no longer read a clock: drop them from OWN_CLOCKS"


# --------------------------------------------------------------------------- results


def _documented_exceptions() -> set[str]:
    """The scripts architecture.md names as not writing through write_results."""
    section = ARCHITECTURE.split("### Results", 1)[1].split("\n### ", 1)[0]
    block = section.split("do not write through `write_results`", 1)[1].split("\n\n", 1)[0]
    return set(re.findall(r"`(benchmarks/[\w/]+\.py)`", block))


def test_benchmark_scripts_write_through_write_results_or_are_listed():
    scripts = {str(p.relative_to(ROOT)) for p in sorted((ROOT / "benchmarks").glob("*.py"))}
    writing = {s for s in scripts if "write_results" in (ROOT / s).read_text(encoding="utf-8")}
    listed = _documented_exceptions()
    assert scripts - writing - listed == set(), "write through kiln.bench.results.write_results, or list it"
    assert listed & writing == set(), "these write through write_results now: drop them from the list"
    assert listed <= scripts, "the list names a script that does not exist"


# --------------------------------------------------------------------------- closed choices

OPEN_STRINGS = {
    "model.name": "a registry name, timm:/hf:/llama: source or user factory",
    "data.source": "a built-in source or module:function",
    "data.path": "a path", "data.labels_path": "a path", "data.eval_path": "a path", "data.eval_labels_path": "a path",
    "training.device": "auto, cpu, cuda or cuda:N",
    "compile.mode": "the installed torch's modes", "compile.backend": "the installed torch's backends",
    "compile.cache_dir": "a path or torch",
    "distributed.fsdp_wrap": "auto, size or class names",
    "checkpoint.resume": "auto, never or a path",
    "metrics.prometheus_host": "an address", "metrics.tracker_project": "a name",
}
"""The `str` config fields whose values are open; every closed choice is a `Literal` field."""


def test_closed_config_choices_are_literal_fields():
    strings = {f"{section}.{name}" for section, cls in typing.get_type_hints(Config).items()
               for name, tp in typing.get_type_hints(cls).items() if tp is str}
    assert strings == set(OPEN_STRINGS), "a closed set of values is a Literal field; an open one is listed here"
