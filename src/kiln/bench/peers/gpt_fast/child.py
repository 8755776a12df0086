"""The process one gpt-fast row of `kiln bench llm` runs in (kiln.bench.peers.gpt_fast.process starts it).

    python -m kiln.bench.peers.gpt_fast.child --checkout DIR --checkpoint DIR/NAME/model.pth \\
        --quantize-int4 GROUP                      # writes DIR/NAME/modelint4.gGROUP.pth, then exits
    python -m kiln.bench.peers.gpt_fast.child --checkout DIR --checkpoint DIR/NAME/<model or int4 file>.pth \\
        --prompt-len 1024 --new-tokens 256 --samples 3 [--device cuda]

It imports gpt-fast from its checkout and runs gpt-fast's own code; kiln only:
- registers the checkpoint's shape (NAME/model_args.json) in gpt-fast's `transformer_configs`
  under NAME, which is how gpt-fast finds a model's shape;
- stands in for the tokenizer: the prompt is synthetic (`--prompt N`: N random ids, gpt-fast's
  benchmarking mode) and the weights are random, so a text tokenizer has nothing to do but
  print the sample; without sentencepiece/tiktoken installed their imports get empty modules;
- with `--quantize-int4 G`: runs gpt-fast's `quantize.quantize(..., "int4", G)` only; a later run
  generates from the file it writes (gpt-fast's generate.py takes int4 and the group size from
  the file name). torch >= 2.5's `_convert_weight_to_int4pack` takes the int4 values packed two
  per uint8 where older torch took int32; the int32 values gpt-fast passes are packed that way
  first (the same values; recorded as an adaptation in the output).
Sampling is gpt-fast's (top-k 200, temperature 0.8, its defaults); decode is compiled with its
`--compile` (mode reduce-overhead), prefill eager. The last line is `KILN_PEER {json}`.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import types
from pathlib import Path

import torch

MARK = "KILN_PEER "


class _Tokenizer:
    """What gpt-fast's main asks of a tokenizer when the prompt is a token count."""

    def __init__(self, *_args) -> None:
        """gpt-fast passes the tokenizer file's path; a synthetic prompt needs no vocabulary."""

    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    def decode(self, tokens: list[int]) -> str:
        return f"<{len(tokens)} token ids>"

    def bos_id(self) -> int:
        return 1

    def eos_id(self) -> int:
        return 2


def _stub_missing(names: tuple[str, ...]) -> list[str]:
    """Empty modules for tokenizer libraries gpt-fast's tokenizer.py imports but this run never uses."""
    stubbed = []
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:
            module = types.ModuleType(name)
            if name == "tiktoken":
                load = types.ModuleType("tiktoken.load")
                load.load_tiktoken_bpe = None
                module.load = load
                sys.modules["tiktoken.load"] = load
            sys.modules[name] = module
            stubbed.append(name)
    return stubbed


def pack_int4_pairs(values: torch.Tensor) -> torch.Tensor:
    """[n, k] int32 values in 0..15 -> [n, k/2] uint8, two per byte (even column in the high nibble),
    the input torch >= 2.5's `_convert_weight_to_int4pack` expects."""
    return (values[:, ::2] << 4 | values[:, 1::2]).to(torch.uint8)


def _adapt_int4pack() -> str | None:
    """Route int32 input of `_convert_weight_to_int4pack` through `pack_int4_pairs` on torch >= 2.5."""
    major, minor = (int(p) for p in torch.__version__.split(".")[:2])
    if (major, minor) < (2, 5):
        return None
    original = torch.ops.aten._convert_weight_to_int4pack

    def convert(weight: torch.Tensor, inner_k_tiles: int):
        if weight.dtype == torch.int32:
            weight = pack_int4_pairs(weight)
        return original(weight, inner_k_tiles)

    torch.ops.aten._convert_weight_to_int4pack = convert
    return "int32 int4 values packed two per uint8 for torch>=2.5's _convert_weight_to_int4pack"


def weight_bytes(checkpoint: Path) -> int:
    """Bytes a decode step reads from this checkpoint: every tensor but the input embedding table
    (one row of it is read per token)."""
    tensors = torch.load(str(checkpoint), mmap=True, weights_only=True)
    return sum(t.numel() * t.element_size() for name, t in tensors.items() if name != "tok_embeddings.weight")


def register(checkout: Path, checkpoint: Path) -> str:
    """Put the checkpoint's shape into gpt-fast's config table under its folder's name."""
    sys.path.insert(0, str(checkout))
    name = checkpoint.parent.name
    gpt_model = importlib.import_module("model")
    gpt_model.transformer_configs[name] = json.loads((checkpoint.parent / "model_args.json").read_text())
    return name


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kiln.bench.peers.gpt_fast.child")
    p.add_argument("--checkout", required=True, type=Path)
    p.add_argument("--checkpoint", required=True, type=Path)
    p.add_argument("--prompt-len", type=int, help="prompt tokens (generation runs)")
    p.add_argument("--new-tokens", type=int, help="tokens generated per request (generation runs)")
    p.add_argument("--samples", type=int, default=3)
    p.add_argument("--quantize-int4", type=int, metavar="GROUP",
                   help="only write gpt-fast's int4 checkpoint (its quantize.py, group size GROUP) and exit")
    p.add_argument("--device", default="cuda")
    p.add_argument("--batch", type=int, default=1, help="gpt-fast's batch_size (generation runs)")
    args = p.parse_args(argv)
    if not args.quantize_int4 and (args.prompt_len is None or args.new_tokens is None):
        p.error("a generation run needs --prompt-len and --new-tokens")
    info: dict = {"peer_stubbed_modules": _stub_missing(("sentencepiece", "tiktoken")), "peer_adaptations": []}
    info["peer_config_name"] = register(args.checkout, args.checkpoint)
    checkpoint = args.checkpoint
    if args.quantize_int4:
        adapted = _adapt_int4pack()
        if adapted:
            info["peer_adaptations"].append(adapted)
        importlib.import_module("quantize").quantize(checkpoint, "int4", args.quantize_int4)
        print(MARK + json.dumps(info), flush=True)
        return 0
    info["weight_bytes"] = weight_bytes(checkpoint)
    generate = importlib.import_module("generate")
    generate.get_tokenizer = _Tokenizer
    print(MARK + json.dumps(info), flush=True)
    generate.main(prompt=args.prompt_len, num_samples=args.samples, max_new_tokens=args.new_tokens, batch_size=args.batch,
                  checkpoint_path=checkpoint, compile=args.device.startswith("cuda"), device=args.device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
