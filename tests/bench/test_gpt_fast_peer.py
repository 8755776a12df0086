"""gpt-fast as a peer of `kiln bench llm`: conversion, command, output parsing, a CPU run, failures."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from kiln.bench.peers.gpt_fast import process as gf
from kiln.bench.peers.gpt_fast.child import pack_int4_pairs
from kiln.cli.main import main
from kiln.llm.config import config_from_dict
from kiln.llm.weights import random_decoder


def _checkout() -> Path | None:
    """A gpt-fast checkout: $KILN_GPT_FAST, the repo's .peers/gpt-fast, or the read-only copy."""
    repo = Path(__file__).resolve().parents[2]
    for candidate in (os.environ.get("KILN_GPT_FAST"), repo / ".peers" / "gpt-fast", "/work/wt/peers_ro/gpt-fast"):
        if candidate and (Path(candidate) / "generate.py").is_file():
            return Path(candidate)
    return None


CHECKOUT = _checkout()
needs_checkout = pytest.mark.skipif(CHECKOUT is None, reason="no gpt-fast checkout (set KILN_GPT_FAST)")

TINY = {"model_type": "llama", "vocab_size": 1024, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256, "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0, "tie_word_embeddings": True,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 32}}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-llama")
    (folder / "config.json").write_text(json.dumps(TINY))
    return folder


def test_rope_rows_go_from_half_split_to_interleaved_pairs():
    # one head of dim 4 over 1 input column: rows [a0, a1, b0, b1] (a_i pairs with b_i) -> [a0, b0, a1, b1]
    w = torch.tensor([[0.0], [1.0], [2.0], [3.0], [10.0], [11.0], [12.0], [13.0]])
    assert gf.interleave_rope_rows(w, heads=2).flatten().tolist() == [0, 2, 1, 3, 10, 12, 11, 13]


def test_model_args_for_llama3_and_refusals():
    config = config_from_dict(TINY)
    args = gf.model_args(config)
    assert args == {"block_size": 256, "vocab_size": 1024, "n_layer": 2, "n_head": 4, "n_local_heads": 2, "dim": 64,
                    "intermediate_size": 96, "rope_base": 500000.0, "norm_eps": 1e-5,
                    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                     "original_max_position_embeddings": 32}}
    qwen3 = config_from_dict({**TINY, "model_type": "qwen3", "head_dim": 32})
    with pytest.raises(ValueError, match="q/k norm.*head_dim 32"):
        gf.model_args(qwen3)


def test_int4_pairs_pack_high_nibble_first():
    values = torch.tensor([[1, 2, 15, 0], [7, 8, 3, 4]], dtype=torch.int32)
    assert pack_int4_pairs(values).tolist() == [[0x12, 0xF0], [0x78, 0x34]]
    assert pack_int4_pairs(values).dtype == torch.uint8


OUTPUT = """Using device=cuda
Loading model ...
Compilation time: 61.23 seconds
Time for inference 1: 0.71 sec total, 360.52 tokens/sec
Bandwidth achieved: 2316.10 GB/s
Time for inference 2: 0.70 sec total, 365.00 tokens/sec
Bandwidth achieved: 2345.00 GB/s
Time for inference 3: 0.72 sec total, 355.10 tokens/sec
Average tokens/sec: 360.21
Memory used: 7.25 GB
KILN_PEER {"weight_bytes": 6000, "peer_adaptations": []}
"""


def test_output_parsing_is_exact():
    got = gf.parse_output(OUTPUT)
    assert got["peer_tok_s_samples"] == [360.52, 365.0, 355.1]
    assert got["peer_request_s_samples"] == [0.71, 0.70, 0.72]
    assert got["peer_avg_tok_s"] == 360.21 and got["peer_compile_s"] == 61.23
    assert got["peer_bandwidth_gbs"] == 2316.10  # the first sample's line
    assert got["peer_memory_reserved_bytes"] == 7_250_000_000
    assert got["weight_bytes"] == 6000
    assert gf.parse_output("nothing")["peer_tok_s_samples"] == []
    assert gf.request_seconds(256, 320.0) == 0.8


def test_commands_name_the_child_the_checkpoint_and_the_int4_group(tmp_path):
    model = tmp_path / "m" / "model.pth"
    int4 = gf.int4_path(model, 64)
    assert int4 == tmp_path / "m" / "modelint4.g64.pth"  # the name gpt-fast's quantize.py writes and generate.py reads
    run = gf.PeerRun(tmp_path / "gpt-fast", int4, "int4", 1024, 256, samples=3, group_size=64)
    cmd = run.command()
    assert cmd[1:3] == ["-m", "kiln.bench.peers.gpt_fast.child"]
    assert cmd[3:] == ["--checkout", str(tmp_path / "gpt-fast"), "--checkpoint", str(int4),
                       "--prompt-len", "1024", "--new-tokens", "256", "--samples", "3", "--device", "cuda",
                       "--batch", "1"]
    assert gf.PeerRun(tmp_path, int4, "int4", 16, 8, batch=16).command()[-2:] == ["--batch", "16"]  # its batch_size
    assert gf.quantize_command(tmp_path / "gpt-fast", model, 64)[3:] == [
        "--checkout", str(tmp_path / "gpt-fast"), "--checkpoint", str(model), "--quantize-int4", "64"]


def test_commit_from_the_carried_marker(tmp_path):
    (tmp_path / "COMMIT").write_text("abc123\n")
    assert gf.checkout_commit(tmp_path) == "abc123"


@needs_checkout
def test_converted_checkpoint_gives_kiln_logits_in_gpt_fast(tmp_path):
    import importlib
    import sys

    from kiln.bench.peers.gpt_fast.child import register

    model = random_decoder(config_from_dict(TINY), device="cpu", dtype=torch.float32, seed=3)
    path = gf.write_checkpoint(model, tmp_path, "kiln-tiny-logits")
    assert (path.parent / "tokenizer.model").is_file()
    register(CHECKOUT, path)
    try:
        Transformer = importlib.import_module("model").Transformer
        with torch.device("meta"):
            theirs = Transformer.from_name("kiln-tiny-logits")
        theirs.load_state_dict(torch.load(path, weights_only=True), assign=True)
        theirs.setup_caches(1, 32)
        tokens = torch.randint(0, 1024, (1, 12), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            torch.testing.assert_close(theirs(tokens, torch.arange(12)), model(tokens), rtol=1e-5, atol=1e-5)
    finally:
        sys.path.remove(str(CHECKOUT))
        sys.modules.pop("model", None)


@needs_checkout
def test_bench_llm_runs_gpt_fast_beside_kiln_and_keeps_a_failing_row(tiny_dir, tmp_path):
    out = tmp_path / "bench"
    code = main(["bench", "llm", "--model", str(tiny_dir), "--prompt-len", "16", "--new-tokens", "5", "--repeats", "2",
                 "--prefill-repeats", "2", "--device", "cpu", "--engines", "kiln-eager", "--gpt-fast", str(CHECKOUT),
                 "--out", str(out)])
    assert code == 0
    rows = {(r["engine"], r["quant"]): r for r in json.loads((out / "results.json").read_text())["results"]}
    peer, kiln = rows[("gpt-fast", "none")], rows[("kiln-eager", "none")]
    assert peer["status"] == "ok", peer["reason"]
    assert peer["peer_commit"] == gf.checkout_commit(CHECKOUT)
    assert peer["request_tok_s"] > 0 and len(peer["peer_tok_s_samples"]) == 2
    assert peer["weight_bytes"] > 0 and peer["roofline_frac"] > 0 and peer["roofline_basis"] == "request_tok_s"
    assert kiln["request_vs_gpt_fast"] == pytest.approx(kiln["request_tok_s"] / peer["request_tok_s"])
    # gpt-fast's int4 packs its weights on CUDA: on this CPU the row fails, with the reason, and the bench goes on
    int4 = rows[("gpt-fast", "int4")]
    assert int4["status"] == "error" and int4["reason"].startswith("quantize: exit 1")
    assert "--quantize-int4 128" in int4["peer_quantize_command"] and int4["peer_commit"] == peer["peer_commit"]
    assert "gpt-fast" in (out / "results.md").read_text()


def test_bad_gpt_fast_flags_exit_2_before_any_work(tiny_dir, tmp_path, capsys):
    base = ["bench", "llm", "--model", str(tiny_dir), "--device", "cpu", "--prompt-len", "8", "--new-tokens", "4",
            "--out", str(tmp_path / "o")]
    assert main([*base, "--gpt-fast", str(tmp_path)]) == 2
    assert "--gpt-fast" in capsys.readouterr().err
    if CHECKOUT is not None:
        assert main([*base, "--gpt-fast", str(CHECKOUT), "--gpt-fast-quant", "int8"]) == 2
        assert "--gpt-fast-quant" in capsys.readouterr().err
        assert main([*base, "--gpt-fast", str(CHECKOUT), "--batch", "2,2"]) == 2  # gpt-fast runs every batch size
        assert "--batch" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
