"""From raw text to a served model on CPU: `kiln data prepare` (BPE trained), `kiln train` on the
prepared directory with validation, `kiln export --out DIR`, then transformers (model and
tokenizer) and `kiln generate` load the export and agree."""

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
    code = main(["train", "model.name=llama:llama-tiny", f"model.kwargs.vocab_size={meta['vocab_size']}",
                 f"model.kwargs.bos_token_id={eos}", f"model.kwargs.eos_token_id={eos}", "data.source=tokens",
                 f"data.path={data}", "data.seq_len=32", "data.batch_size=4", "data.num_workers=0",
                 "training.steps=6", "training.log_interval=3", "training.eval_interval=3", "training.eval_steps=2",
                 "training.device=cpu", "optim.lr=3e-3", "metrics.console=false", "metrics.tensorboard=false",
                 "--run-dir", str(run)])
    assert code == 0, capsys.readouterr().err
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "eval_perplexity" in r] == [3, 6]

    out = tmp_path / "hf"
    assert main(["export", str(run), "--out", str(out)]) == 0
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
    assert tokenizer.eos_token_id == eos
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
