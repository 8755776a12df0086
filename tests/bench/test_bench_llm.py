"""`kiln bench llm`: every engine on a tiny checkpoint on CPU, result files, skips, bad input."""

from __future__ import annotations

import json

import pytest
import torch

from kiln.bench.ceilings import measure_ceilings
from kiln.bench.timing import StepClock
from kiln.cli.main import main

transformers = pytest.importorskip("transformers")

from tests.llm.conftest import write_checkpoint  # noqa: E402

LLM_KEYS = ("engine", "quant", "prefill_tok_s", "decode_tok_s", "ttft_ms", "peak_mem_bytes", "roofline_frac")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("bench") / "llama", "llama3-tied")


def test_ceilings_are_measured_on_the_spot():
    c = measure_ceilings("cpu", torch.float32, copy_bytes=8 << 20, matmul_n=128)
    assert c.copy_bytes_per_s > 1e8 and c.matmul_flops_per_s > 1e7
    assert c.as_dict()["dtype"] == "float32" and c.copy_bytes == 8 << 20


def test_step_clock_marks_in_order():
    clock = StepClock("cpu")
    clock.start()
    for _ in range(3):
        torch.ones(64, 64) @ torch.ones(64, 64)
        clock.mark()
    marks = clock.marks_s()
    assert len(marks) == 3 and 0 <= marks[0] <= marks[1] <= marks[2]


def test_every_engine_side_by_side_on_cpu(tiny, tmp_path):
    out = tmp_path / "bench"
    code = main(["bench", "llm", "--model", str(tiny), "--prompt-len", "20", "--new-tokens", "6", "--repeats", "2",
                 "--prefill-repeats", "3", "--device", "cpu", "--out", str(out)])
    assert code == 0
    payload = json.loads((out / "results.json").read_text())
    assert (out / "results.md").is_file() and (out / "results.png").is_file()
    rows = {r["engine"]: r for r in payload["results"]}
    assert list(rows) == ["hf-eager", "hf-compiled", "kiln-eager", "kiln-compiled"]
    for name, row in rows.items():
        assert row["status"] == "ok", (name, row["reason"])
        for key in LLM_KEYS:
            assert key in row, (name, key)
        assert row["quant"] == "none" and row["prefill_tok_s"] > 0 and row["decode_tok_s"] > 0
        assert 0 < row["roofline_frac"] < 1 and row["ttft_ms"] > 0
        assert row["token_ms_p50"] <= row["token_ms_p90"]
        assert row["greedy_match"] == 6, name  # fp32, same weights: every engine decodes the same tokens
    assert rows["kiln-compiled"]["compiles"] == 2  # one prefill bucket (32) + the decode step
    assert rows["kiln-eager"]["compiles"] == 0 and rows["kiln-compiled"]["compile_s"] > 0
    assert rows["kiln-eager"]["logits_max_abs_err"] < 1e-4 and rows["kiln-eager"]["logits_top1_match"] == 1.0
    assert "uncompiled" in rows["hf-compiled"]["note"]  # transformers compiles on CUDA only
    assert payload["config"]["ceilings"]["copy_bytes_per_s"] > 0
    assert payload["config"]["bench"]["engines"] == list(rows)
    assert "kiln bench llm" in (out / "results.md").read_text()


def test_hf_rows_are_skipped_without_transformers(tiny, tmp_path, monkeypatch):
    import kiln.bench.llm_bench as llm_bench

    monkeypatch.setattr(llm_bench, "hf_available", lambda: "transformers is not installed (test)")
    out = tmp_path / "bench"
    code = main(["bench", "llm", "--model", str(tiny), "--engines", "hf-compiled,kiln-eager", "--prompt-len", "8",
                 "--new-tokens", "3", "--repeats", "1", "--prefill-repeats", "1", "--warmup", "0", "--device", "cpu",
                 "--out", str(out)])
    assert code == 0
    rows = json.loads((out / "results.json").read_text())["results"]
    assert [(r["engine"], r["status"]) for r in rows] == [("hf-compiled", "skipped"), ("kiln-eager", "ok")]
    assert "not installed" in rows[0]["reason"]


@pytest.mark.parametrize(("args", "needles"), [
    (["--engines", "vllm"], ["--engines", "kiln-compiled"]),
    (["--preset", "seed003"], ["--preset", "seed002-llama3b"]),
    (["--new-tokens", "300"], ["--new-tokens", "positions"]),
    (["--batch", "0"], ["--batch", ">= 1"]),
    (["--dtype", "fp8"], ["--dtype", "bf16"]),
    (["--device", "gpu"], ["--device", "not a device"]),
    pytest.param(["--device", "cuda"], ["--device", "no CUDA"],
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")),
    (["--model", "llama-3.2-3"], ["--model", "llama-3.2-3b"]),
    (["--inductor", "coordinate_descent_tunin=true"], ["--inductor", "coordinate_descent_tuning"]),
    (["--inductor", "max_autotune"], ["--inductor", "KEY=VALUE"]),
])
def test_bad_input_exits_2_with_one_line_before_any_work(tiny, tmp_path, capsys, args, needles):
    out = tmp_path / "out"
    base = ["bench", "llm", "--model", str(tiny), "--prompt-len", "20", "--new-tokens", "8", "--out", str(out)]
    code = main(base + args)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err
    assert not out.exists()
