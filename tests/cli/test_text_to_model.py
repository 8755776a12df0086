"""From raw text to a served model on CPU: `kiln data prepare` (BPE trained), `kiln train` on the
prepared directory with validation, `kiln export --out DIR`, then transformers (model and
tokenizer) and `kiln generate` load the export and agree, and both stop at the tokenizer's
end-of-text (id 0 of the trained BPE), not at the preset's eos id 2 (an ordinary character there)."""

from __future__ import annotations

import json

import pytest
import torch

from kiln.cli.main import main

transformers = pytest.importorskip("transformers")

from tests.data.test_prepare import english  # noqa: E402


def test_text_to_exported_model_round_trip(tmp_path, capsys):
    (tmp_path / "book.txt").write_text(english(800, 3), encoding="utf-8")
    data = tmp_path / "data"
    assert main(["data", "prepare", str(tmp_path / "book.txt"), "--train-bpe", "320", "--out", str(data),
                 "--val-fraction", "0.1"]) == 0
    meta = json.loads((data / "meta.json").read_text())
    eos = meta["eos_token_id"]
    run = tmp_path / "run"
    assert eos == 0  # the trained BPE's <|endoftext|>; the llama-tiny preset says bos 1 / eos 2
    code = main(["train", "model.name=llama:llama-tiny", f"model.kwargs.vocab_size={meta['vocab_size']}",
                 "data.source=tokens",
                 f"data.path={data}", "data.seq_len=32", "data.batch_size=4", "data.num_workers=0",
                 "training.steps=6", "training.log_interval=3", "training.eval_interval=3", "training.eval_steps=2",
                 "training.device=cpu", "optim.lr=3e-3", "metrics.console=false", "metrics.tensorboard=false",
                 "--run-dir", str(run)])
    assert code == 0, capsys.readouterr().err
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "eval_perplexity" in r] == [3, 6]

    assert {json.loads((run / "model" / "config.json").read_text())[k] for k in ("bos_token_id", "eos_token_id")} \
        == {eos}
    out = tmp_path / "hf"
    assert main(["export", str(run), "--out", str(out)]) == 0
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
    assert tokenizer.eos_token_id == eos
    assert transformers.GenerationConfig.from_pretrained(str(out)).eos_token_id == eos
    assert json.loads((out / "config.json").read_text())["eos_token_id"] == eos
    prompt = "The quick brown fox"
    ids = tokenizer(prompt)["input_ids"]
    assert tokenizer.decode(ids) == prompt

    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    from kiln.llm.config import resolve_model
    from kiln.llm.weights import build_decoder

    kiln_model = build_decoder(resolve_model(str(out)), device="cpu", dtype=torch.float32)
    tokens = torch.tensor([ids])
    with torch.no_grad():
        torch.testing.assert_close(kiln_model(tokens), hf(tokens).logits, rtol=1e-5, atol=1e-5)

    capsys.readouterr()
    code = main(["generate", "--model", str(out), "--prompt", prompt, "--max-new-tokens", "6", "--ignore-eos",
                 "--device", "cpu", "--compile", "off", "--json", str(tmp_path / "gen.json")])
    assert code == 0, capsys.readouterr().err
    generated = json.loads((tmp_path / "gen.json").read_text())["tokens"][0]
    greedy = hf.generate(tokens, max_new_tokens=6, do_sample=False, eos_token_id=None, pad_token_id=eos)
    assert greedy[0, len(ids):].tolist() == generated

    # Without --ignore-eos: the requested tokens, cut only at the tokenizer's end-of-text.
    code = main(["generate", "--model", str(out), "--prompt", prompt, "--max-new-tokens", "6", "--device", "cpu",
                 "--compile", "off", "--json", str(tmp_path / "gen_eos.json")])
    assert code == 0, capsys.readouterr().err
    result = json.loads((tmp_path / "gen_eos.json").read_text())
    assert result["stop_tokens"] == [eos]
    cut = generated.index(eos) + 1 if eos in generated else 6
    assert result["tokens"][0] == generated[:cut]


def test_generation_stops_at_the_tokenizers_end_of_text(tmp_path, capsys):
    """A model whose every logit is equal picks id 0 greedily: the trained BPE's <|endoftext|>.
    kiln generate and transformers stop there after one token (before: they ran on to the limit,
    waiting for id 2)."""
    from safetensors.torch import load_file, save_file

    (tmp_path / "book.txt").write_text(english(200, 3), encoding="utf-8")
    data = tmp_path / "data"
    assert main(["data", "prepare", str(tmp_path / "book.txt"), "--train-bpe", "300", "--out", str(data),
                 "--val-fraction", "0"]) == 0
    run = tmp_path / "run"
    assert main(["train", "model.name=llama:llama-tiny", "model.kwargs.vocab_size=300", "data.source=tokens",
                 f"data.path={data}", "data.seq_len=16", "data.batch_size=2", "data.num_workers=0",
                 "training.steps=1", "training.device=cpu", "metrics.console=false", "metrics.tensorboard=false",
                 "--run-dir", str(run)]) == 0
    out = tmp_path / "hf"
    assert main(["export", str(run), "--out", str(out)]) == 0
    weights = load_file(str(out / "model.safetensors"))
    weights["lm_head.weight"].zero_()
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    capsys.readouterr()
    assert main(["generate", "--model", str(out), "--prompt", "The quick", "--max-new-tokens", "5", "--device", "cpu",
                 "--compile", "off", "--json", str(tmp_path / "gen.json")]) == 0
    result = json.loads((tmp_path / "gen.json").read_text())
    assert result["tokens"] == [[0]] and result["finish"] == ["stop"]
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
    ids = tokenizer("The quick", return_tensors="pt")["input_ids"]
    assert hf.generate(ids, max_new_tokens=5, do_sample=False)[0, ids.shape[1]:].tolist() == [0]
