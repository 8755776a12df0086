"""Host memory: a model this host cannot hold is refused before it is built (exit 2 naming the
estimate and the host's memory), and out-of-host-memory advice weighs the model, not only the batch."""

from __future__ import annotations

import pytest

from kiln.config import load_config
from kiln.failure.classify import diagnose
from kiln.models import host_memory
from kiln.models.host_memory import GIB, check_fits, training_state_bytes


def test_the_estimate_counts_weights_grads_and_optimizer_state():
    assert training_state_bytes(10, device_type="cpu", optimizer="adamw") == 10 * (4 + 4 + 8)
    assert training_state_bytes(10, device_type="cpu", optimizer="sgd", momentum=0.9) == 10 * 12
    assert training_state_bytes(10, device_type="cpu", optimizer="sgd", momentum=0.0) == 10 * 8
    assert training_state_bytes(10, device_type="cuda", optimizer="adamw") == 40


def test_a_model_too_large_for_the_host_is_refused_before_it_is_built(tmp_path, monkeypatch, capsys):
    from kiln.cli.main import main

    monkeypatch.setattr(host_memory, "host_memory", lambda: (23 * GIB, 20 * GIB))
    run_dir = tmp_path / "run"
    # 8B parameters' worth of MLP, counted on the meta device: nothing is allocated.
    code = main(["train", "--run-dir", str(run_dir), "model.kwargs.hidden_size=20000", "model.kwargs.num_layers=20",
                 "training.device=cpu"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2
    assert err.startswith("kiln: error: model.name: 8.20B parameters need at least 122.2 GiB of host memory")
    assert "this host has 20.0 GiB available of 23.0 GiB" in err
    assert not run_dir.exists()


def test_a_model_that_fits_passes(monkeypatch):
    monkeypatch.setattr(host_memory, "host_memory", lambda: (23 * GIB, 20 * GIB))
    check_fits(1_000_000, device_type="cpu")
    with pytest.raises(ValueError, match="KILN_SKIP_MEMORY_CHECK"):
        check_fits(8_000_000_000, device_type="cuda")
    monkeypatch.setenv("KILN_SKIP_MEMORY_CHECK", "1")
    check_fits(8_000_000_000, device_type="cuda")


def test_host_oom_advice_blames_a_huge_model_first(monkeypatch):
    monkeypatch.setattr(host_memory, "host_memory", lambda: (23 * GIB, 1 * GIB))
    cfg = load_config(None, ["training.device=cpu"])
    error = RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: "
                         "you tried to allocate 4294967296 bytes")
    advice = diagnose(error, cfg=cfg, model_params=1_000_000_000).advice
    assert advice.startswith("the failed allocation asked for 4.0 GiB; the model's 1000.0M parameters hold 14.9 GiB")
    assert advice.index("the model itself is the bulk") < advice.index("data.batch_size")
    small = diagnose(MemoryError(), cfg=cfg, model_params=1000).advice
    assert "the model itself" not in small and "data.batch_size" in small


@pytest.mark.parametrize("example", ["torch.randn(4, 8)", "torch.randint(0, 16, (4, 6))"])
def test_a_user_model_whose_forward_reads_values_is_sized_on_meta_and_checked(tmp_path, monkeypatch, example):
    """The meta-device count does not run the user's forward (a meta tensor has no values for
    `.item()` or a branch on them): such a model is neither refused nor left unchecked."""
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
    counted = []
    monkeypatch.setattr(host_memory, "check_fits", lambda n, **kwargs: counted.append(n))
    cfg = load_config(None, [f"model.name={tmp_path / 'valued.py'}:build", "training.device=cpu"])
    host_memory.check_model_fits(cfg.model, "cpu", cfg.optim)
    assert counted == [16 * 8 + 8 * 16 + 16]
