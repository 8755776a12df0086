"""One user-model contract for train / bench / explain / doctor: inferred from example inputs, or one
clear error saying what to add; the README's own-model example runs as written."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from kiln.config import ConfigError, ModelConfig
from kiln.models import InputSpec, build_model

ROOT = Path(__file__).resolve().parents[2]

MODELS = textwrap.dedent(
    """
    import torch
    import torch.nn as nn
    from helpers import Encoder  # a sibling module, as in a real project


    class Classifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = Encoder(12, 16)
            self.head = nn.Linear(16, 5)

        def forward(self, x):
            return self.head(self.enc(x))


    class TinyLM(nn.Module):
        def __init__(self, vocab=40):
            super().__init__()
            self.emb = nn.Embedding(vocab, 16)
            self.out = nn.Linear(16, vocab)

        def forward(self, ids):
            return self.out(self.emb(ids))


    class Scorer(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(12, 1)

        def forward(self, x):
            return self.fc(x).squeeze(-1)


    def classifier():
        return Classifier(), torch.randn(4, 12)

    def lm():
        return TinyLM(), torch.randint(0, 40, (2, 24))

    def plain():
        return Classifier()

    def scorer():
        return Scorer(), torch.randn(4, 12)
    """
)
HELPERS = textwrap.dedent(
    """
    import torch.nn as nn


    class Encoder(nn.Sequential):
        def __init__(self, d_in, d):
            super().__init__(nn.Linear(d_in, d), nn.GELU())
    """
)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "models.py").write_text(MODELS)
    (tmp_path / "helpers.py").write_text(HELPERS)
    yield tmp_path / "models.py"
    sys.modules.pop("helpers", None)
    while str(tmp_path) in sys.path:
        sys.path.remove(str(tmp_path))


def test_example_inputs_give_spec_and_classes(project: Path) -> None:
    built = build_model(ModelConfig(name=f"{project}:classifier"))
    assert built.input_spec == InputSpec("features", (12,), num_classes=5)
    assert built.task == "classification"
    assert built.module.training  # the probe call left the mode as it was


def test_token_ids_with_vocab_logits_give_a_causal_lm(project: Path) -> None:
    built = build_model(ModelConfig(name=f"{project}:lm"))
    assert built.input_spec == InputSpec("tokens", (24,), vocab_size=40)
    assert built.task == "causal_lm"


def test_output_that_is_not_logits_leaves_the_classes_open(project: Path) -> None:
    built = build_model(ModelConfig(name=f"{project}:scorer"))
    assert built.input_spec == InputSpec("features", (12,))  # [batch] scores: no class count to read


def test_a_sibling_import_loads_and_a_missing_one_names_the_folder(project: Path, tmp_path: Path) -> None:
    assert type(build_model(ModelConfig(name=f"{project}:plain")).module).__name__ == "Classifier"
    broken = tmp_path / "other" / "broken.py"
    broken.parent.mkdir()
    broken.write_text("from no_such_sibling import Block\n\ndef build():\n    return Block()\n")
    with pytest.raises(ConfigError, match=r"model\.name.*No module named 'no_such_sibling'") as info:
        build_model(ModelConfig(name=f"{broken}:build"))
    assert f"looked in {broken.parent}" in str(info.value)
    assert str(broken.parent) not in sys.path


def _kiln(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(ROOT / "src"),
                                                                                 os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "kiln", *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=300)


@pytest.mark.parametrize("command", ["train", "explain"])
def test_a_bare_module_gets_one_error_naming_what_to_add(project: Path, command: str) -> None:
    args = ["train", f"model.name={project}:plain", "training.steps=1", "--run-dir", str(project.parent / "run")]
    if command == "explain":
        args = ["explain", f"{project}:plain"]
    proc = _kiln(args, project.parent)
    assert proc.returncode == 2, proc.stderr
    err = [ln for ln in proc.stderr.strip().splitlines() if not ln.startswith("kiln: cpu:")]  # thread notes
    assert len(err) == 1 and "(model, example_inputs)" in err[0] and "torch.randn(8, 512)" in err[0], err
    assert not (project.parent / "run" / "summary.json").exists()


def test_readme_own_model_example_runs_as_written(tmp_path: Path) -> None:
    lines = [ln for ln in (ROOT / "README.md").read_text().splitlines() if "examples/my_models.py:build" in ln]
    command = next(ln for ln in lines if ln.startswith("kiln train"))
    argv = shlex.split(re.sub(r"\s+#.*$", "", command))
    (tmp_path / "examples").symlink_to(ROOT / "examples")  # run from a checkout's root
    proc = _kiln(argv[1:], tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (summary,) = (tmp_path / "runs").glob("*/summary.json")
    report = json.loads(summary.read_text())
    assert report["status"] == "completed"


def test_the_shipped_example_serves_explain_and_train_alike() -> None:
    from kiln.diagnose.explain import explain_target
    from kiln.diagnose.target import load_target

    spec = f"{ROOT / 'examples' / 'my_models.py'}:build"
    built = build_model(ModelConfig(name=spec, kwargs={"width": 32}))
    assert built.input_spec == InputSpec("features", (64,), num_classes=10) and built.task == "classification"
    report = explain_target(load_target(spec, {"width": 32}), vary=[])
    assert report["clean"] and report["inputs"] == ["float32[8, 64]"]
    assert torch.is_tensor(built.module(torch.randn(2, 64)))


@pytest.mark.parametrize("factory", ["classifier", "lm"])
def test_built_on_meta_the_spec_is_the_same(project: Path, factory: str) -> None:
    """bench, advise and autotune size the data from a model built on the meta device: the forward
    runs there on shapes alone and tells the same classes or vocabulary as the real build."""
    real = build_model(ModelConfig(name=f"{project}:{factory}"))
    with torch.device("meta"):
        meta = build_model(ModelConfig(name=f"{project}:{factory}"))
    assert meta.input_spec == real.input_spec and meta.task == real.task


def test_a_bench_of_a_model_whose_forward_reads_values_builds_its_data(tmp_path: Path) -> None:
    """A forward that branches on values cannot run on meta: the bench builds the model for real
    to learn its classes instead of refusing a working model."""
    from kiln.bench.compile.runner import build_context
    from kiln.config import load_config

    (tmp_path / "valued.py").write_text(textwrap.dedent(
        """
        import torch
        def build():
            class M(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.fc = torch.nn.Linear(6, 3)
                def forward(self, x):
                    if x.abs().max() > 1e6:
                        raise ValueError("inputs out of range")
                    return self.fc(x)
            return M(), torch.randn(4, 6)
        """))
    cfg = load_config(None, [f"model.name={tmp_path / 'valued.py'}:build", "training.device=cpu", "data.batch_size=4"])
    ctx = build_context(cfg, torch.device("cpu"), train=True, batches=1)
    (x, y), = ctx.batches
    assert x.shape == (4, 6) and int(y.max()) < 3


def test_the_shipped_example_benches_as_its_docstring_says(tmp_path: Path) -> None:
    """`kiln bench compile --model examples/my_models.py:build`, eager only."""
    out = tmp_path / "bench"
    proc = subprocess.run(
        [sys.executable, "-m", "kiln", "bench", "compile", "--model", "examples/my_models.py:build",
         "--modes", "eager", "--precisions", "fp32", "--steps", "3", "--warmup", "1", "--out", str(out),
         "training.device=cpu", "model.kwargs.width=16"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "synthetic features need" not in proc.stderr


def test_doctor_repro_of_the_shipped_example_imports_its_sibling_module(tmp_path: Path) -> None:
    from kiln.diagnose.doctor import run_doctor
    from kiln.diagnose.target import load_target

    drift = ROOT / "tests" / "diagnose" / "planted.py"
    report = run_doctor(load_target(f"{ROOT / 'examples' / 'my_models.py'}:build", {"width": 16}), stages=["eager"],
                        backends=[f"{drift}:drift_backend"], out_dir=tmp_path)
    proc = subprocess.run([sys.executable, report["repro"]], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 1 and "reproduced" in proc.stdout, proc.stdout + proc.stderr
