"""`kiln bench llm` on a CPU counts every model it would build (transformers' and kiln's, quantized
copies), the KV caches and the prefill logits, and refuses a bench the host cannot hold in seconds
(exit 2, nothing written), naming what would fit."""

from __future__ import annotations

import time

from kiln.bench.llm import llm_memory
from kiln.bench.llm.llm_memory import bench_host_bytes
from kiln.bench.llm.llm_options import LlmBenchOptions, check_options
from kiln.cli.main import main
from kiln.models.host_memory import GIB


def test_the_seed002_preset_is_refused_on_a_cpu_in_seconds(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(llm_memory, "host_memory", lambda: (23 * GIB, 22 * GIB))
    out = tmp_path / "llm"
    started = time.monotonic()
    code = main(["bench", "llm", "--preset", "seed002-llama3b", "--device", "cpu", "--out", str(out)])
    assert time.monotonic() - started < 60
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2, err
    assert err.startswith("kiln: error: --model: this bench needs about 25.5 GiB of host memory on this CPU")
    assert "transformers model 12.0 GiB, kiln model 12.0 GiB" in err
    assert "--engines kiln-eager,kiln-compiled (one model, not two)" in err and "--dtype bf16" in err
    assert not out.exists()


def test_the_estimate_counts_each_model_built():
    both = check_options(LlmBenchOptions(model="llama-tiny", device="cpu", dtype="fp32", batch=[2], prompt_len=16,
                                         new_tokens=8))
    kiln_only = check_options(LlmBenchOptions(model="llama-tiny", device="cpu", dtype="fp32", batch=[2],
                                              prompt_len=16, new_tokens=8, engines=["kiln-eager"]))
    parts, alone = bench_host_bytes(both), bench_host_bytes(kiln_only)
    assert parts["transformers model"] == parts["kiln model"] == alone["kiln model"] > 0
    assert "transformers model" not in alone
    # llama-tiny: 2 layers, 2 KV heads of 16 dims, fp32; 2 x 24 tokens per engine.
    assert alone["KV caches (1 engines)"] == 2 * 24 * 2 * 2 * 2 * 16 * 4
    assert parts["KV caches (4 engines)"] == 4 * alone["KV caches (1 engines)"]
    assert parts["prefill logits"] == 2 * 16 * 512 * 4


def test_each_batch_size_adds_its_caches():
    """--batch 2,4: every engine keeps a cache per batch size (6 rows of 24 tokens); the prefill
    logits of the largest batch."""
    plan = check_options(LlmBenchOptions(model="llama-tiny", device="cpu", dtype="fp32", batch=[2, 4], prompt_len=16,
                                         new_tokens=8, engines=["kiln-eager"]))
    parts = bench_host_bytes(plan)
    assert parts["KV caches (1 engines)"] == 6 * 24 * 2 * 2 * 2 * 16 * 4
    assert parts["prefill logits"] == 4 * 16 * 512 * 4
