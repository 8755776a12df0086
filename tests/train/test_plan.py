"""The run's plan: a launcher and its ranks decide the compile defaults, run dir and precision alike."""

from __future__ import annotations

import torch

from kiln.config import load_config
from kiln.precision import resolve_precision
from kiln.train.plan import Placement, plan_train


def test_one_gpu_process_takes_the_measured_recipe_into_its_plan(tmp_path):
    cfg = load_config(None, ["compile.enabled=true", "precision.policy=bf16-mixed"])
    plan = plan_train(cfg, tmp_path / "run", Placement("cuda", 1, launched=False), torch.device("meta"))
    assert plan.cfg is cfg and cfg.compile.cudagraphs is True
    assert plan.compile_note is not None and plan.compile_note.startswith("compile: kiln's measured recipe for mlp")
    assert plan.run_dir == tmp_path / "run" and plan.continuing is False
    assert plan.policy == resolve_precision("bf16-mixed", torch.device("meta"))


def test_a_job_of_two_ranks_keeps_torchs_compile_defaults(tmp_path):
    cfg = load_config(None, ["compile.enabled=true"])
    plan = plan_train(cfg, str(tmp_path), Placement("cuda", 2, launched=True), torch.device("meta"))
    assert plan.compile_note is None and cfg.compile.cudagraphs is False
    assert plan.run_dir == tmp_path


def test_a_continued_run_says_where_and_how_to_start_anew(tmp_path):
    cfg = load_config(None, [])
    plan = plan_train(cfg, tmp_path, Placement("cpu", 1, launched=False), torch.device("cpu"))
    assert plan.continuing_line() == (f"continuing the unfinished run of this config in {tmp_path} (pass --run-dir "
                                      "NEW_DIR to start a new run instead)")
