"""metrics.tracker: an MLflow run gets the config as parameters and every record's numbers at their
steps (read back through MLflow's own client); a tracker that is not installed is exit 2 before any
work."""

from __future__ import annotations

import pytest

from kiln.cli.main import main
from kiln.config import load_config
from kiln.train.trainer import train

TINY = ["model.kwargs.hidden_size=32", "model.kwargs.num_layers=2", "model.kwargs.num_classes=4", "data.batch_size=8",
        "training.steps=6", "training.log_interval=2", "training.device=cpu", "metrics.console=false",
        "metrics.tensorboard=false"]


def test_an_mlflow_run_holds_the_config_and_the_metrics(tmp_path, monkeypatch):
    mlflow = pytest.importorskip("mlflow")
    pytest.importorskip("sqlalchemy")  # the SQLite store kiln uses when MLFLOW_TRACKING_URI is unset
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    run_dir = tmp_path / "run"
    summary = train(load_config(None, [*TINY, "metrics.tracker=mlflow", "metrics.tracker_project=p46"]), run_dir)
    assert summary["status"] == "completed"
    client = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{(run_dir / 'mlflow.db').resolve()}")
    (run,) = client.search_runs([client.get_experiment_by_name("p46").experiment_id])
    assert run.info.run_name == "run" and run.info.status == "FINISHED"
    assert run.data.params["training.steps"] == "6" and run.data.params["model.name"] == "mlp"
    history = client.get_metric_history(run.info.run_id, "loss")
    assert [m.step for m in history] == [1, 2, 4, 6]
    records = [__import__("json").loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m.value for m in history] == pytest.approx([r["loss"] for r in records])


def test_a_tracker_that_is_not_installed_is_bad_input(tmp_path, monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    run_dir = tmp_path / "run"
    code = main(["train", "--run-dir", str(run_dir), *TINY, "metrics.tracker=wandb"])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("kiln: error:")]
    assert code == 2 and len(errors) == 1
    assert "metrics.tracker: wandb is not installed: pip install 'kiln[wandb]'" in errors[0]
    assert not run_dir.exists()
