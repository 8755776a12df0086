"""Checks of an exported model trained on a prepared corpus (used by benchmarks/llm_real_text.sh).

    python benchmarks/llm_real_text_check.py HF_DIR DATA_DIR --out check.json [--device cuda] [--tokens N]

Writes one JSON object:
- `unigram_val_ppl`: perplexity of DATA_DIR/val.bin under the add-one-smoothed unigram model of
  train.bin (kiln.data.prepared.unigram_perplexity), the floor a language model must beat, next to
  the figure `kiln data prepare` recorded in meta.json;
- `val_ppl_kiln_bf16`, `val_ppl_hf_fp32`: the exported model's perplexity on the first N validation
  tokens (windows of the model's training length), kiln's decoder in bf16 and transformers in fp32;
- `logits_real_text`: kiln vs transformers logits on 4 windows of real validation text, fp32 against
  fp32 and bf16 against the fp32 reference beside transformers' own bf16 error (the parity rule of
  kiln.llm.parity: kiln-bf16 within 1.5x of HF-bf16's error), and top-1 agreement;
- `parity`: kiln.llm.parity.compare_with_hf on the directory (random tokens, greedy decoding);
- `tokenizer`: AutoTokenizer loads the directory and round-trips a sentence.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch


def _errors(got: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    diff = (got.float() - ref.float()).abs()
    return {"max_abs": float(diff.max()), "mean_abs": float(diff.mean()),
            "top1_match": float((got.argmax(-1) == ref.argmax(-1)).float().mean())}


@torch.inference_mode()
def _hf_ppl(model, tokens: list[int], context: int, device: torch.device) -> float:
    nll, count = 0.0, 0
    for start in range(0, len(tokens) - 1, context):
        window = torch.tensor(tokens[start:start + context], device=device).view(1, -1)
        if window.shape[1] < 2:
            break
        logits = model(window).logits[0, :-1].float()
        nll += float(torch.nn.functional.cross_entropy(logits, window[0, 1:], reduction="sum"))
        count += window.shape[1] - 1
    return math.exp(nll / count)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("hf_dir", type=Path)
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tokens", type=int, default=65536, help="validation tokens scored for perplexity")
    parser.add_argument("--context", type=int, default=1024)
    args = parser.parse_args()

    import transformers

    from kiln.data.prepared import read_prepared, unigram_perplexity
    from kiln.llm.config import resolve_model
    from kiln.llm.parity import compare_with_hf
    from kiln.llm.quality import perplexity
    from kiln.llm.weights import build_decoder

    device = torch.device(args.device)
    result: dict = {"hf_dir": str(args.hf_dir), "data_dir": str(args.data_dir), "device": str(device),
                    "transformers": transformers.__version__, "torch": torch.__version__}
    prepared = read_prepared(args.data_dir)
    train = np.fromfile(prepared.train_path, dtype=prepared.dtype)
    val = np.fromfile(prepared.val_path, dtype=prepared.dtype)
    result["unigram_val_ppl"] = unigram_perplexity(train, val, prepared.meta["vocab_size"])
    result["unigram_val_ppl_meta"] = prepared.meta.get("unigram_val_perplexity")
    result["val_tokens_total"] = int(val.size)
    tokens = val[: args.tokens].astype(np.int64).tolist()
    source = resolve_model(str(args.hf_dir))
    context = min(args.context, source.config.max_positions)

    def step(name, fn):
        t0 = time.perf_counter()
        try:
            result[name] = fn()
        except Exception as exc:  # one failing check must not hide the others
            result[name] = {"error": f"{type(exc).__name__}: {exc}"}
        print(f"{name}: {json.dumps(result[name])[:300]} ({time.perf_counter() - t0:.1f} s)", flush=True)

    def kiln_ppl():
        model = build_decoder(source, device=device, dtype=torch.bfloat16)
        out = perplexity(model, tokens, context=context)
        del model
        return out["ppl"]

    step("val_ppl_kiln_bf16", kiln_ppl)

    def real_text_logits():
        hf32 = transformers.AutoModelForCausalLM.from_pretrained(str(args.hf_dir), dtype=torch.float32).to(device)
        hf32.eval()
        windows = torch.tensor(tokens[: 4 * 512], device=device).view(4, 512)
        saved = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            with torch.inference_mode():
                ref = hf32(windows).logits.float()
                hf_ppl = _hf_ppl(hf32, tokens, context, device)
                kiln32 = build_decoder(source, device=device, dtype=torch.float32)
                fp32 = _errors(kiln32(windows), ref)
                del kiln32
                hf_bf16 = _errors(hf32.to(torch.bfloat16)(windows).logits, ref)
                del hf32
                kiln16 = build_decoder(source, device=device, dtype=torch.bfloat16)
                bf16 = _errors(kiln16(windows), ref)
                del kiln16
        finally:
            torch.backends.cuda.matmul.allow_tf32 = saved
        scale = float(ref.abs().max())
        result["val_ppl_hf_fp32"] = hf_ppl
        return {"positions": list(windows.shape), "reference_max_abs_logit": scale, "kiln_fp32_vs_hf_fp32": fp32,
                "hf_bf16_vs_hf_fp32": hf_bf16, "kiln_bf16_vs_hf_fp32": bf16,
                "ok_fp32": fp32["max_abs"] <= 1e-3 * scale,
                "ok_bf16": bf16["max_abs"] <= 1.5 * hf_bf16["max_abs"] + 1e-6 * scale}

    step("logits_real_text", real_text_logits)
    step("parity", lambda: compare_with_hf(source, device=device, positions=512, greedy_steps=32).to_json())

    def tokenizer_check():
        tok = transformers.AutoTokenizer.from_pretrained(str(args.hf_dir))
        text = "The kernel schedules tasks on every CPU.\n"
        ids = tok(text)["input_ids"]
        return {"class": type(tok).__name__, "ids": len(ids), "round_trip": tok.decode(ids) == text,
                "eos_token": tok.eos_token, "eos_token_id": tok.eos_token_id}

    step("tokenizer", tokenizer_check)
    args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
