"""`kiln bench llm`: every engine on a tiny checkpoint on CPU, result files, skips, bad input."""

from __future__ import annotations

import json

import pytest
import torch

from kiln.bench.ceilings import measure_ceilings
from kiln.cli.main import main
from kiln.timing import StepClock

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


def test_several_batch_sizes_in_one_run(tiny, tmp_path):
    """--batch 1,3: every engine once per batch size, labelled by it, each with the bytes its step
    reads (weights + the KV cache of its rows), its step time against batch 1, and the batch-3
    row's first prompt decoding the batch-1 row's tokens (the same prompt)."""
    out = tmp_path / "bench"
    code = main(["bench", "llm", "--model", str(tiny), "--engines", "hf-eager,kiln-eager", "--batch", "1,3",
                 "--prompt-len", "20", "--new-tokens", "6", "--repeats", "1", "--prefill-repeats", "1", "--warmup", "0",
                 "--device", "cpu", "--out", str(out)])
    assert code == 0
    payload = json.loads((out / "results.json").read_text())
    rows = {r["label"]: r for r in payload["results"]}
    assert list(rows) == ["hf-eager b1", "kiln-eager b1", "hf-eager b3", "kiln-eager b3"]
    assert all(r["status"] == "ok" for r in rows.values())
    one, three = rows["kiln-eager b1"], rows["kiln-eager b3"]
    assert three["batch"] == 3 and three["kv_bytes_per_step"] == 3 * one["kv_bytes_per_step"]
    assert three["decode_tok_s_per_seq"] == pytest.approx(three["decode_tok_s"] / 3)
    assert three["step_vs_batch1"] == pytest.approx(three["decode_step_ms"] / one["decode_step_ms"])
    assert three["greedy_match_batch1"] == 6 and three["greedy_match"] == 6  # fp32: same tokens as alone, as HF
    assert three["prefill_flops"] == 3 * one["prefill_flops"]
    assert payload["config"]["bench"]["batches"] == [1, 3] and "--batch 1,3" in payload["command"]
    assert "| batch |" in (out / "results.md").read_text()


def test_hf_rows_are_skipped_without_transformers(tiny, tmp_path, monkeypatch):
    import kiln.bench.llm.llm_bench as llm_bench

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
    (["--prompt-len", "300", "--new-tokens", "4"], ["--prompt-len", "no room", "256 positions"]),
    (["--batch", "0"], ["--batch", ">= 1"]),
    (["--dtype", "fp8"], ["--dtype", "bf16"]),
    (["--device", "gpu"], ["--device", "not a device"]),
    pytest.param(["--device", "cuda"], ["--device", "no CUDA"],
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")),
    (["--model", "llama-3.2-3"], ["--model", "llama-3.2-3b"]),
    (["--inductor", "coordinate_descent_tunin=true"], ["--inductor", "coordinate_descent_tuning"]),
    (["--inductor", "max_autotune"], ["--inductor", "KEY=VALUE"]),
    (["--quant", "int3"], ["--quant", "int3", "nf4"]),
    (["--quant", "none,int8,int8"], ["--quant", "twice"]),
    (["--quant", "int8@torch,int8@inductor"], ["--quant", "same quantization"]),
    (["--quant", "int4", "--device", "cpu"], ["--quant", "needs CUDA"]),
    (["--quant", "int4@torch"], ["--group-size", "does not divide the 32 input features"]),
    (["--quant", "int8", "--engines", "hf-eager"], ["--quant", "kiln's engines"]),
    (["--quant", "int8@torch", "--group-size", "7"], ["--group-size", "does not divide"]),
    (["--quant-backend", "cutlass", "--quant", "int8"], ["--quant-backend", "inductor"]),
    (["--ppl-file", "no/such/file.txt"], ["--ppl-file", "cannot read"]),
    (["--prefill", "lazy"], ["--prefill", "eager"]),
    (["--tuning", "max"], ["--tuning", "decode"]),
    (["--deadline-s", "0"], ["--deadline-s", "> 0"]),
    (["--profile-decode", "6"], ["--profile-decode", "at most 5"]),
    (["--profile-decode", "-1"], ["--profile-decode", ">= 0"]),
    (["--profile-decode", "2", "--engines", "hf-eager"], ["--profile-decode", "kiln's engines"]),
    (["--profile-prefill", "-1"], ["--profile-prefill", ">= 0"]),
    (["--profile-prefill", "2", "--engines", "hf-eager"], ["--profile-prefill", "kiln's engines"]),
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


def test_an_earlier_run_in_out_is_refused_and_kept(tiny, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_text('{"earlier": true}')
    code = main(["bench", "llm", "--model", str(tiny), "--prompt-len", "8", "--new-tokens", "3", "--device", "cpu",
                 "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "--out" in err and "already holds results" in err and len(err.splitlines()) == 1
    assert (out / "results.json").read_text() == '{"earlier": true}'


@pytest.mark.parametrize("where", ["held", "unwritable"])
def test_an_out_held_or_unwritable_is_refused_before_any_work(tiny, tmp_path, capsys, where):
    from kiln.outputs import RunDirLock

    out = tmp_path / "out"
    argv = ["bench", "llm", "--model", str(tiny), "--prompt-len", "8", "--new-tokens", "3", "--device", "cpu"]
    if where == "held":
        with RunDirLock(out):  # a first bench, still measuring, holds its --out
            code = main([*argv, "--out", str(out)])
        needle = "in use by a running kiln"
        assert list(out.iterdir()) == []
    else:
        (tmp_path / "file").write_text("x")
        code = main([*argv, "--out", str(tmp_path / "file" / "out")])
        needle = "cannot create it"
    err = capsys.readouterr().err.strip()
    assert code == 2 and "--out" in err and needle in err and len(err.splitlines()) == 1, err


def test_decode_profile_of_each_kiln_row(tiny, tmp_path):
    out = tmp_path / "bench"
    code = main(["bench", "llm", "--model", str(tiny), "--engines", "hf-eager,kiln-eager,kiln-compiled",
                 "--prompt-len", "8", "--new-tokens", "8", "--repeats", "1", "--prefill-repeats", "1", "--warmup", "0",
                 "--device", "cpu", "--profile-decode", "4", "--out", str(out)])
    assert code == 0
    payload = json.loads((out / "results.json").read_text())
    rows = {r["engine"]: r for r in payload["results"]}
    hf = json.loads((tiny / "config.json").read_text())
    head_dim = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
    assert "profile" not in rows["hf-eager"]  # transformers' rows are not profiled
    for name in ("kiln-eager", "kiln-compiled"):
        row = rows[name]
        folder = out / "decode_profile" / name
        summary = json.loads((folder / "summary.json").read_text())
        assert row["profile"] == str(folder / "summary.md") and (folder / "trace.pt.trace.json.gz").stat().st_size > 0
        assert summary["steps"] == 4 and summary["wall_ms_per_step"] > 0 and row["profile_ms_per_step"] > 0
        # Bytes per step: the weights once plus the cache slots (k and v, all layers, fp32) the window's
        # steps attend, on average: after the prefill's token and two warm-up steps, a row of 8 prompt
        # tokens attends 11, 12, 13 and 14 slots (the cache holds more).
        per_slot = 2 * hf["num_hidden_layers"] * hf["num_key_value_heads"] * head_dim * 4
        assert summary["bytes_per_step"] == row["weight_bytes"] + per_slot * (11 + 12 + 13 + 14) // 4
        assert row["kv_cache_bytes"] > per_slot * 14
        assert summary["gpu"]["status"] == "n/a" and row["profile_idle_frac"] is None
        ops = {op["name"]: op for op in summary["cpu"]["top"]}
        assert any(n in ops for n in ("aten::mm", "aten::addmm", "aten::linear"))  # the projections, every step
        assert row["profile_verdict"].startswith("no GPU timeline on this device; the host op taking most time is")
        assert "What bounds it" in (folder / "summary.md").read_text()
    assert f"--profile-decode 4 --out {out}" in payload["command"]


def test_prefill_profile_of_each_kiln_row(tiny, tmp_path):
    out = tmp_path / "bench"
    code = main(["bench", "llm", "--model", str(tiny), "--engines", "hf-eager,kiln-eager", "--batch", "1,2",
                 "--prompt-len", "8", "--new-tokens", "4", "--repeats", "1", "--prefill-repeats", "1", "--warmup", "0",
                 "--device", "cpu", "--profile-prefill", "3", "--out", str(out)])
    assert code == 0
    payload = json.loads((out / "results.json").read_text())
    rows = {(r["engine"], r["batch"]): r for r in payload["results"]}
    assert "prefill_profile" not in rows[("hf-eager", 1)] and not (out / "decode_profile").exists()
    for batch in (1, 2):
        row = rows[("kiln-eager", batch)]
        folder = out / "prefill_profile" / f"kiln-eager_b{batch}"
        summary = json.loads((folder / "summary.json").read_text())
        assert row["prefill_profile"] == str(folder / "summary.md")
        assert summary["calls"] == 3 and row["prefill_profile_ms"] == summary["wall_ms_per_call"] > 0
        assert summary["flops_per_call"] == row["prefill_flops"] == rows[("kiln-eager", 1)]["prefill_flops"] * batch
        assert row["prefill_profile_idle_frac"] is None and row["prefill_profile_host_ms"] > 0
        assert row["prefill_profile_verdict"].startswith("no GPU timeline on this device; the host op taking most")
        assert "ms/prefill" in row["prefill_profile_verdict"]
        assert "| host op | calls/prefill | self ms/prefill |" in (folder / "summary.md").read_text()
    assert f"--profile-prefill 3 --out {out}" in payload["command"]


@pytest.fixture(scope="module")
def quant_config(tmp_path_factory):
    from tests.llm.test_llm_quant import QUANT_CONFIG

    path = tmp_path_factory.mktemp("quant") / "config.json"
    path.write_text(json.dumps(QUANT_CONFIG))
    return path


def test_quant_rows_with_quality_and_their_own_roofline(quant_config, tmp_path):
    ids = tmp_path / "ids.txt"
    ids.write_text(" ".join(str((7 * i) % 256) for i in range(600)))
    out = tmp_path / "bench"
    code = main(["bench", "llm", "--model", str(quant_config), "--engines", "kiln-eager", "--quant",
                 "none,int8@torch,int4@inductor", "--group-size", "64", "--ppl-file", str(ids), "--ppl-context", "128",
                 "--prompt-len", "16", "--new-tokens", "5", "--repeats", "1", "--prefill-repeats", "1", "--warmup", "0",
                 "--device", "cpu", "--out", str(out)])
    assert code == 0
    payload = json.loads((out / "results.json").read_text())
    rows = {r["quant"]: r for r in payload["results"]}
    assert list(rows) == ["none", "int8@torch", "int4@inductor"]
    none, int8, int4 = rows["none"], rows["int8@torch"], rows["int4@inductor"]
    for row in rows.values():
        assert row["status"] == "ok", row["reason"]
        for key in (*LLM_KEYS, "weight_bytes", "model_bytes", "ppl", "ppl_ratio"):
            assert key in row and (row[key] is not None or key == "peak_mem_bytes"), (row["quant"], key)  # CUDA only
        assert row["roofline_tok_s"] == pytest.approx(
            payload["config"]["ceilings"]["read_bytes_per_s"] / (row["weight_bytes"] + row["kv_bytes_per_step"]))
        assert row["step_bytes"] == row["weight_bytes"] + row["kv_bytes_per_step"] and row["kv_bytes_per_step"] > 0
    assert none["weight_bytes"] > 3 * int8["weight_bytes"] > 1.5 * 3 * int4["weight_bytes"]  # fp32 -> 8 -> 4 bits
    assert (int8["quant_kind"], int8["quant_backend"], int4["quant_backend"], int4["group_size"]) == \
        ("int8", "torch", "inductor", 64)
    assert none["ppl_ratio"] == 1.0 and none["ppl"] == int8["ppl_ref"] and int8["ppl_tokens"] == 4 * 127 + 87
    for row in (int8, int4):
        assert row["drift_ok"] is True and 0 < row["drift_kl"] <= row["drift_bound"]
        assert 0 < row["drift_top1"] <= 1 and row["drift_max_abs"] >= row["drift_mean_abs"] > 0
        assert row["decode_vs_unquantized"] > 0
    assert payload["config"]["quality"]["drift_from_ppl_text"] is True  # 600 tokens >= 4 prompts x 128
    md = (out / "results.md").read_text()
    assert "drift_kl" in md and "ppl_ratio" in md and "int4@inductor" in md


@pytest.mark.parametrize(("bound", "weights", "needle"), [
    ("DRIFT_BOUNDS", "checkpoint", "over the int8 bound"),  # quality: judged on real weights
    ("FIDELITY_BOUND", "random", "kernel fidelity"),  # kernels: judged on any weights
])
def test_rows_over_a_drift_bound_are_marked_and_keep_their_figures(tiny, quant_config, tmp_path, monkeypatch, bound,
                                                                   weights, needle):
    from kiln.llm import quality

    if bound == "DRIFT_BOUNDS":
        monkeypatch.setitem(quality.DRIFT_BOUNDS, "int8", 1e-12)
    else:
        monkeypatch.setattr(quality, "FIDELITY_BOUND", -1.0)
    out = tmp_path / "bench"
    model = tiny if weights == "checkpoint" else quant_config
    code = main(["bench", "llm", "--model", str(model), "--engines", "kiln-eager", "--quant", "none,int8@torch",
                 "--prompt-len", "8", "--new-tokens", "3", "--repeats", "1", "--prefill-repeats", "1", "--warmup", "0",
                 "--device", "cpu", "--out", str(out)])
    assert code == 0
    rows = json.loads((out / "results.json").read_text())["results"]
    assert [r["status"] for r in rows] == ["ok", "accuracy_fail"]
    assert needle in rows[1]["reason"] and rows[1]["decode_tok_s"] > 0 and rows[1]["drift_ok"] is False


def test_random_weights_are_judged_on_kernel_fidelity_only(quant_config, tmp_path, monkeypatch):
    from kiln.llm import quality

    monkeypatch.setitem(quality.DRIFT_BOUNDS, "int8", 1e-12)  # would fail any real checkpoint
    out = tmp_path / "bench"
    code = main(["bench", "llm", "--model", str(quant_config), "--engines", "kiln-eager", "--quant", "int8@torch",
                 "--prompt-len", "8", "--new-tokens", "3", "--repeats", "1", "--prefill-repeats", "1", "--warmup", "0",
                 "--device", "cpu", "--out", str(out)])
    assert code == 0
    row = json.loads((out / "results.json").read_text())["results"][0]
    assert row["status"] == "ok" and row["drift_ok"] is True and "random weights" in row["drift_judged"]
    assert row["fidelity_kl"] < row["fidelity_bound"] and row["drift_kl"] > 0


def test_nf4_without_bitsandbytes_is_a_skipped_row(quant_config, tmp_path, monkeypatch):
    import kiln.bench.llm.llm_quant as llm_quant

    monkeypatch.setattr(llm_quant, "bitsandbytes_missing", lambda: "bitsandbytes is not installed (test)")
    out = tmp_path / "bench"
    code = main(["bench", "llm", "--model", str(quant_config), "--engines", "kiln-eager", "--quant", "none,nf4",
                 "--prompt-len", "8", "--new-tokens", "3", "--repeats", "1", "--prefill-repeats", "1", "--warmup", "0",
                 "--device", "cpu", "--out", str(out)])
    assert code == 0
    rows = json.loads((out / "results.json").read_text())["results"]
    assert [(r["quant"], r["status"]) for r in rows] == [("none", "ok"), ("nf4", "skipped")]
    assert "not installed" in rows[1]["reason"] and rows[1]["quant_backend"] == "bitsandbytes"


def test_rows_past_the_deadline_are_skipped_and_the_run_still_writes(quant_config, tmp_path):
    out = tmp_path / "bench"
    code = main(["bench", "llm", "--model", str(quant_config), "--engines", "kiln-eager,kiln-compiled",
                 "--prompt-len", "8", "--new-tokens", "3", "--repeats", "1", "--deadline-s", "1e-6",
                 "--device", "cpu", "--out", str(out)])
    assert code == 0
    rows = json.loads((out / "results.json").read_text())["results"]
    assert [r["status"] for r in rows] == ["skipped", "skipped"] and "--deadline-s" in rows[0]["reason"]


def test_perplexity_bound_on_real_weights_marks_the_row(tiny, tmp_path, monkeypatch):
    from kiln.llm import quality

    ids = tmp_path / "ids.txt"
    ids.write_text(" ".join(str((7 * i) % 96) for i in range(300)))
    monkeypatch.setitem(quality.PPL_BOUNDS, "int8", 0.5)  # a ratio can never be this low: the row must fail
    out = tmp_path / "bench"
    code = main(["bench", "llm", "--model", str(tiny), "--engines", "kiln-eager", "--quant", "none,int8@torch",
                 "--ppl-file", str(ids), "--ppl-context", "64", "--prompt-len", "8", "--new-tokens", "3",
                 "--repeats", "1", "--prefill-repeats", "1", "--warmup", "0", "--device", "cpu", "--out", str(out)])
    assert code == 0
    rows = json.loads((out / "results.json").read_text())["results"]
    assert [r["status"] for r in rows] == ["ok", "accuracy_fail"]
    assert "perplexity" in rows[1]["reason"] and "over the int8 bound" in rows[1]["reason"]
    assert rows[1]["ppl_bound"] == 0.5 and rows[1]["ppl_judged"] is True and rows[1]["ppl_ratio"] > 0.5


def test_the_quant_figures_and_parity_are_engine_row_fields_in_its_order():
    """A quantized copy's figures and the logits parity are set on rows by name: each field is one of
    EngineRow's, in EngineRow's order, so results.json keeps its keys where they always were."""
    import dataclasses

    from kiln.bench.llm.llm_engine_row import EngineRow, LogitsParity
    from kiln.bench.llm.llm_quant import QuantFigures
    from kiln.bench.typed_row import UNSET

    row_fields = [f.name for f in dataclasses.fields(EngineRow)]
    for cls in (QuantFigures, LogitsParity):
        names = [f.name for f in dataclasses.fields(cls)]
        assert names == [n for n in row_fields if n in names], cls.__name__
    figures = dataclasses.replace(QuantFigures(quant_kind="int8", quant_backend="torch", group_size=None,
                                               quant_lm_head=True), ppl=2.5, drift_ok=True)
    assert figures.to_json() == {"quant_kind": "int8", "quant_backend": "torch", "group_size": None,
                                 "quant_lm_head": True, "drift_ok": True, "ppl": 2.5}
    assert figures.get("drift_kl") is None and figures.drift_kl is UNSET
    with pytest.raises(dataclasses.FrozenInstanceError):
        figures.ppl = 3.0  # type: ignore[misc]


def test_only_rows_whose_model_runs_the_int4_kernel_record_its_settings(monkeypatch):
    """`int4_settings` (the one-row int4 kernel's autotuner choices, kept per process) is recorded on
    a row whose model has int4@triton layers, not on a bf16 row of the same process."""
    pytest.importorskip("triton", reason="Triton is not installed (pip install 'kiln[test]')")
    from tests.llm.test_llm_quant import QUANT_CONFIG

    from kiln.bench.llm.llm_engines import KilnEngine
    from kiln.kernels import triton_int4
    from kiln.llm.config import config_from_dict
    from kiln.llm.quant import QuantSpec, quantize_decoder
    from kiln.llm.weights import random_decoder

    monkeypatch.setattr(triton_int4, "tuned_settings", lambda: {"5120,3072,128,1,3,False,False": [64, 8, 3, 4]})
    small = {**QUANT_CONFIG, "vocab_size": 96, "hidden_size": 64, "intermediate_size": 128}
    dense = random_decoder(config_from_dict(small), device="cpu", dtype=torch.float32, seed=0)
    int4 = quantize_decoder(dense, QuantSpec(kind="int4", group_size=32, backend="triton"))
    stats = {name: KilnEngine("kiln-eager", model, [[1, 2, 3]], 2).compile_stats()
             for name, model in (("dense", dense), ("int4", int4))}
    assert "int4_settings" not in stats["dense"]
    assert stats["int4"]["int4_settings"] == {"5120,3072,128,1,3,False,False": [64, 8, 3, 4]}
