"""A CPU run the host cannot hold is refused in seconds (exit 2, nothing written), its estimate
counting activations as well as weights, gradients and optimizer state, and naming the batch size
that would fit or that none does (kiln.train.memory_plan)."""

from __future__ import annotations

import time

import pytest

from kiln.cli.main import main
from kiln.config import load_config
from kiln.models import host_memory
from kiln.models.host_memory import GIB
from kiln.train import memory_plan
from kiln.train.memory_plan import check_run_fits, plan_host_memory

# README's LLM recipe (meant for an H100), as a newcomer runs it on a CPU machine.
LLAMA_RECIPE = ["model.name=llama:llama-3.2-1b", "data.seq_len=2048", "precision.policy=bf16-master",
                "compile.enabled=true", "compile.scope=model+loss", "training.ce_kernel=triton"]


def _host(monkeypatch, total_gib: float, available_gib: float) -> None:
    monkeypatch.setattr(memory_plan, "host_memory", lambda: (int(total_gib * GIB), int(available_gib * GIB)))


def test_the_readme_llm_recipe_is_refused_on_a_cpu_in_seconds(tmp_path, monkeypatch, capsys):
    _host(monkeypatch, 23, 20)
    run_dir = tmp_path / "run"
    started = time.monotonic()
    code = main(["train", "--run-dir", str(run_dir), *LLAMA_RECIPE, "training.device=cpu"])
    assert time.monotonic() - started < 60  # seconds, not the minutes of a compile the kernel then kills
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2, err
    assert err.startswith("kiln: error: data.batch_size: this run of 1.24B parameters needs about")
    assert "activations (batch 32)" in err and "no batch size fits at this data.seq_len" in err
    assert "meant for a GPU (training.ce_kernel=triton, precision.policy=bf16-master)" in err
    assert "this host has 20.0 GiB available of 23.0 GiB" in err
    assert not run_dir.exists()


def test_a_model_too_large_for_the_host_is_refused_before_it_is_built(tmp_path, monkeypatch, capsys):
    _host(monkeypatch, 23, 20)
    run_dir = tmp_path / "run"
    # 8B parameters' worth of MLP, counted on the meta device: nothing is allocated.
    code = main(["train", "--run-dir", str(run_dir), "model.kwargs.hidden_size=20000", "model.kwargs.num_layers=20",
                 "training.device=cpu"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2
    assert err.startswith("kiln: error: model.name: this run of 8.20B parameters needs about")
    assert "(weights 30.6 GiB, gradients 30.6 GiB, optimizer state 61.1 GiB, activations (batch 32)" in err
    assert "the model alone does not fit" in err
    assert not run_dir.exists()


def test_the_batch_size_that_fits_is_named_and_passes(monkeypatch):
    over = ["model.name=llama:llama-tiny", "data.seq_len=256", "data.batch_size=16", "training.device=cpu"]
    plan = plan_host_memory(load_config(None, over), "cpu")
    fixed = plan.total - 16 * plan.activations_per_sample
    _host(monkeypatch, 64, (fixed + 5.5 * plan.activations_per_sample) / GIB)
    with pytest.raises(ValueError, match=r"data.batch_size=5 fits; training.activation_checkpointing=full keeps less"):
        check_run_fits(load_config(None, over), "cpu")
    assert check_run_fits(load_config(None, [*over, "data.batch_size=5"]), "cpu") is not None
    monkeypatch.setenv("KILN_SKIP_MEMORY_CHECK", "1")
    assert check_run_fits(load_config(None, over), "cpu") is None


def test_activations_are_measured_per_sample_and_checkpointing_keeps_less():
    base = ["model.name=llama:llama-tiny", "data.seq_len=128", "training.device=cpu"]
    one, two = (plan_host_memory(load_config(None, [*base, f"data.batch_size={b}"]), "cpu") for b in (4, 8))
    assert one.parts["activations (batch 4)"] * 2 == two.parts["activations (batch 8)"] > 0
    # llama-tiny: 2 blocks of hidden 64, MLP 128; per token each block keeps at least its input,
    # q, k, v, attention output, the MLP's gate, up and product: far more than the hidden size alone.
    assert one.activations_per_sample > 2 * 128 * (64 * 4 + 3 * 128 * 4)
    full = plan_host_memory(load_config(None, [*base, "data.batch_size=4", "training.activation_checkpointing=full"]),
                            "cpu")
    assert full.parts["activations (batch 4)"] < one.parts["activations (batch 4)"]
    assert plan_host_memory(load_config(None, base), "cuda").parts.keys() == {"fp32 weights as built"}


@pytest.mark.parametrize("example", ["torch.randn(4, 8)", "torch.randint(0, 16, (4, 6))"])
def test_a_user_model_whose_forward_reads_values_is_sized_on_meta_and_checked(tmp_path, monkeypatch, example):
    """The meta-device forward cannot run a forward that reads values (a meta tensor has none for
    `.item()` or a branch on them): such a model is not refused, its parameters are still counted."""
    (tmp_path / "valued.py").write_text(
        "import torch\n"
        "class M(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.emb = torch.nn.Embedding(16, 8)\n"
        "        self.lin = torch.nn.Linear(8, 16)\n"
        "    def forward(self, x):\n"
        "        if x.abs().max() > 1000:\n"
        "            raise ValueError('inputs out of range')\n"
        "        return self.lin(self.emb(x) if x.dtype == torch.long else x[..., :8].float())\n"
        f"def build():\n    return M(), {example}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    _host(monkeypatch, 23, 20)
    cfg = load_config(None, [f"model.name={tmp_path / 'valued.py'}:build", "training.device=cpu"])
    plan = check_run_fits(cfg, "cpu")
    assert plan.num_params == 16 * 8 + 8 * 16 + 16
    assert not any(name.startswith("activations") for name in plan.parts)


def test_host_memory_reads_this_host():
    total, available = host_memory.host_memory()
    assert total is None or 0 < available <= total
