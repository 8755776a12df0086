"""gpt-fast (github.com/pytorch-labs/gpt-fast) as a peer row of `kiln bench llm`.

gpt-fast is a user's checkout (its path given to kiln, its commit recorded); nothing of it is
copied into kiln. For one bench kiln:
1. writes the bench's model (kiln's decoder, the same weights kiln's rows run) as the checkpoint
   gpt-fast loads: `<dir>/<name>/model.pth` with gpt-fast's parameter names, q/k rows reordered
   from the half-split RoPE layout (HF, kiln) to gpt-fast's interleaved pairs, and an empty
   `tokenizer.model` its `main` insists on (the prompt is synthetic; see the child);
2. starts kiln.bench.peers.gpt_fast.child in a subprocess per row, which registers the shape in
   gpt-fast's own config table under `<name>`, quantizes through gpt-fast's `quantize.py` for
   int4, and calls gpt-fast's `generate.main` with the bench's prompt length and new tokens;
3. reads gpt-fast's printed figures: tokens/s of each sample (gpt-fast counts the new tokens over
   the whole request, prefill included: `request_tok_s` of kiln's rows counts the same way), its
   compile time and memory. A failing row keeps its error and the bench goes on.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from kiln.bench.peers.gpt_fast.row import ENGINE, GptFastRow
from kiln.distributed.launch import run_bounded
from kiln.errors import ConfigError

QUANTS = ("none", "int4")
REQUIRED_FILES = ("generate.py", "model.py", "quantize.py", "tokenizer.py")
MARK = "KILN_PEER "
"""Prefix of the child's one JSON line (what kiln learned besides gpt-fast's own output)."""


def check_checkout(path: str | Path, flag: str = "--gpt-fast") -> Path:
    """The checkout directory, or a ConfigError naming the flag and what is missing."""
    root = Path(path)
    missing = [f for f in REQUIRED_FILES if not (root / f).is_file()]
    if not root.is_dir() or missing:
        raise ConfigError(flag, f"{root} is not a gpt-fast checkout (missing {', '.join(missing) or 'the directory'})",
                          ("a directory with gpt-fast's generate.py, model.py, quantize.py, tokenizer.py",))
    return root


def checkout_commit(root: Path) -> str | None:
    """The checkout's commit: a COMMIT file (a carried copy), else `git rev-parse HEAD`."""
    marker = root / "COMMIT"
    if marker.is_file():
        return marker.read_text().strip() or None
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


# -- the model, as gpt-fast loads it ---------------------------------------------------------------
def model_args(config) -> dict[str, Any]:
    """gpt-fast `ModelArgs` fields for a kiln DecoderConfig; ValueError for what gpt-fast's
    Transformer has no way to express."""
    unsupported = [name for name, on in (("qkv bias", config.qkv_bias), ("output bias", config.out_bias),
                                         ("MLP bias", config.mlp_bias), ("q/k norm", config.qk_norm),
                                         ("sliding windows", any(config.windows)),
                                         ("RoPE kind " + config.rope.kind, config.rope.kind not in ("default", "llama3")))
                   if on]
    if config.head_dim * config.n_heads != config.dim:
        unsupported.append(f"head_dim {config.head_dim} != dim / n_heads")
    if unsupported:
        raise ValueError(f"gpt-fast's Transformer cannot run this model: {', '.join(unsupported)}")
    args: dict[str, Any] = {
        "block_size": config.max_positions, "vocab_size": config.vocab_size, "n_layer": config.n_layers,
        "n_head": config.n_heads, "n_local_heads": config.n_kv_heads, "dim": config.dim,
        "intermediate_size": config.ffn_dim, "rope_base": config.rope.theta, "norm_eps": config.norm_eps,
    }
    if config.rope.kind == "llama3":
        r = config.rope
        args["rope_scaling"] = {"factor": r.factor, "low_freq_factor": r.low_freq_factor,
                                "high_freq_factor": r.high_freq_factor,
                                "original_max_position_embeddings": r.original_max_positions}
    return args


def interleave_rope_rows(w: Tensor, heads: int) -> Tensor:
    """q or k projection rows from the half-split RoPE layout (dimension i pairs with i + D/2) to
    the interleaved one (2i pairs with 2i + 1): per head, row 2i <- i and row 2i+1 <- i + D/2."""
    rows, cols = w.shape
    d = rows // heads
    return w.reshape(heads, 2, d // 2, cols).transpose(1, 2).reshape(rows, cols)


def state_dict(model) -> dict[str, Tensor]:
    """kiln Decoder -> gpt-fast Transformer state dict (CPU tensors, the model's dtype)."""
    c = model.config
    q, kv = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
    out: dict[str, Tensor] = {}

    def put(name: str, t: Tensor) -> None:
        out[name] = t.detach().to("cpu", copy=True).contiguous()

    put("tok_embeddings.weight", model.embed.weight)
    put("norm.weight", model.norm.weight)
    put("output.weight", model.lm_head.weight)
    for i, layer in enumerate(model.layers):
        wq, wk, wv = layer.attn.wqkv.weight.split([q, kv, kv])
        wqkv = torch.cat([interleave_rope_rows(wq, c.n_heads), interleave_rope_rows(wk, c.n_kv_heads), wv])
        gate, up = layer.ffn.w_gate_up.weight.split([c.ffn_dim, c.ffn_dim])
        p = f"layers.{i}."
        put(p + "attention.wqkv.weight", wqkv)
        put(p + "attention.wo.weight", layer.attn.wo.weight)
        put(p + "feed_forward.w1.weight", gate)
        put(p + "feed_forward.w3.weight", up)
        put(p + "feed_forward.w2.weight", layer.ffn.w_down.weight)
        put(p + "attention_norm.weight", layer.attn_norm.weight)
        put(p + "ffn_norm.weight", layer.ffn_norm.weight)
    return out


def write_checkpoint(model, directory: Path, name: str) -> Path:
    """`directory/name/model.pth` (+ the empty tokenizer.model gpt-fast's main asserts on); returns
    the checkpoint path."""
    folder = directory / name
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.pth"
    torch.save(state_dict(model), path)
    (folder / "tokenizer.model").write_bytes(b"")
    (folder / "model_args.json").write_text(json.dumps(model_args(model.config)))
    return path


# -- one row: the command, its output ----------------------------------------------------------------
@dataclass(frozen=True)
class PeerRun:
    checkout: Path
    checkpoint: Path
    quant: str
    prompt_len: int
    new_tokens: int
    samples: int = 3
    group_size: int = 128
    device: str = "cuda"
    batch: int = 1
    """gpt-fast's `batch_size` (it repeats the prompt in every row)."""

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "kiln.bench.peers.gpt_fast.child", "--checkout", str(self.checkout),
               "--checkpoint", str(self.checkpoint), "--prompt-len", str(self.prompt_len),
               "--new-tokens", str(self.new_tokens), "--samples", str(self.samples), "--device", self.device,
               "--batch", str(self.batch)]
        return cmd


def quantize_command(checkout: Path, checkpoint: Path, group_size: int) -> list[str]:
    """The child run that writes gpt-fast's int4 checkpoint next to `checkpoint` (its quantize.py)."""
    return [sys.executable, "-m", "kiln.bench.peers.gpt_fast.child", "--checkout", str(checkout),
            "--checkpoint", str(checkpoint), "--quantize-int4", str(group_size)]


def int4_path(checkpoint: Path, group_size: int) -> Path:
    """Where gpt-fast's quantize.py writes the int4 checkpoint of `checkpoint` (and where its
    generate.py reads the group size back from)."""
    return checkpoint.with_name(checkpoint.name.replace(".pth", f"int4.g{group_size}.pth"))


_FLOAT = r"([0-9]+(?:\.[0-9]+)?)"


def parse_output(text: str) -> dict[str, Any]:
    """gpt-fast's printed figures: per-sample tokens/s, their mean as it prints it, compile time,
    bandwidth and memory; plus the child's own JSON line."""
    found = re.findall(rf"Time for inference \d+: {_FLOAT} sec total, {_FLOAT} tokens/sec", text)
    out: dict[str, Any] = {"peer_request_s_samples": [float(s) for s, _ in found],
                           "peer_tok_s_samples": [float(t) for _, t in found]}

    def one(pattern: str) -> float | None:
        found = re.search(pattern, text)
        return float(found.group(1)) if found else None

    out["peer_avg_tok_s"] = one(rf"Average tokens/sec: {_FLOAT}")
    out["peer_compile_s"] = one(rf"Compilation time: {_FLOAT} seconds")
    out["peer_bandwidth_gbs"] = one(rf"Bandwidth achieved: {_FLOAT} GB/s")
    memory = one(rf"Memory used: {_FLOAT} GB")
    out["peer_memory_reserved_bytes"] = int(memory * 1e9) if memory is not None else None
    for line in text.splitlines():
        if line.startswith(MARK):
            out.update(json.loads(line[len(MARK):]))
    return out


def _tail(text: str, lines: int = 3) -> str:
    kept = [line.strip() for line in text.strip().splitlines() if line.strip()][-lines:]
    return " | ".join(kept)[-300:]


def run_row(run: PeerRun, timeout_s: float, row: GptFastRow) -> GptFastRow:
    """One gpt-fast row (`row` holds what is known before it runs): status ok with its figures, or
    error/timeout with the reason and the output's last lines."""
    row.update(status="ok", reason=None, peer_command=" ".join(run.command()[1:]),
               group_size=run.group_size if run.quant == "int4" else None)
    code, out, err = _child(run.command(), timeout_s)
    row.update(**parse_output(out))
    if code is None:
        row.update(status="error", reason=f"{err}: {_tail(out)}")
        return row
    if code != 0 or not row.peer_tok_s_samples:
        row.update(status="error", reason=f"exit {code}: {_tail(err or out)}")
        return row
    # gpt-fast prints the seconds to 2 decimals and tokens/s to 2 decimals: the rate is the finer figure.
    # Its tokens/s are one sequence's (new tokens per row over the request); a batch makes `batch` times as many.
    per_sequence = statistics.median(row.peer_tok_s_samples)
    row.update(request_tok_s=per_sequence * run.batch, generate_s=request_seconds(run.new_tokens, per_sequence))
    return row


def request_seconds(new_tokens: int, tok_s: float) -> float:
    """The request time gpt-fast's tokens/s implies (it divides the new tokens by it)."""
    return new_tokens / tok_s


@dataclass
class Prepared:
    """gpt-fast's checkpoints for one bench, written before kiln's rows are timed."""

    folder: Path
    base: dict[str, Any]
    """Fields every row carries: gpt-fast's commit and checkout."""
    checkpoints: dict[str, Path] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    extra: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per quant: how its checkpoint was made (the quantize command, its time)."""

    def close(self) -> None:
        import shutil

        shutil.rmtree(self.folder, ignore_errors=True)


def _child(cmd: list[str], timeout_s: float) -> tuple[int | None, str, str]:
    code, out, err = run_bounded(cmd, timeout_s, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    return code, out, err if code is not None else f"timed out after {timeout_s:.0f} s"


def prepare(model, checkout: Path, *, quants: tuple[str, ...], group_size: int, timeout_s: float, log=print,
            work_dir: Path | None = None) -> Prepared:
    """Write `model` (a kiln Decoder) as gpt-fast's checkpoint in a temporary folder and, for int4,
    run gpt-fast's quantize.py on it (a subprocess). A failure is kept per quant, not raised."""
    import tempfile
    import time

    commit = checkout_commit(checkout)
    prep = Prepared(Path(tempfile.mkdtemp(prefix="kiln-gpt-fast-", dir=work_dir)),
                    {"peer_commit": commit, "peer_checkout": str(checkout)})
    try:
        log(f"gpt-fast ({commit}): writing the model as its checkpoint")
        checkpoint = write_checkpoint(model, prep.folder, f"kiln-{model.config.family}-{model.config.n_layers}l")
    except Exception as exc:
        prep.errors = dict.fromkeys(quants, f"{type(exc).__name__}: {exc}"[:300])
        return prep
    for quant in quants:
        if quant == "none":
            prep.checkpoints[quant] = checkpoint
            continue
        cmd = quantize_command(checkout, checkpoint, group_size)
        log(f"gpt-fast[{quant}]: quantizing with its quantize.py")
        started = time.perf_counter()
        code, out, err = _child(cmd, timeout_s)
        adapted = parse_output(out).get("peer_adaptations") or []
        prep.extra[quant] = {"peer_quantize_command": " ".join(cmd[1:]), "peer_quantize_s": time.perf_counter() - started,
                             "peer_quantize_adaptations": adapted}
        target = int4_path(checkpoint, group_size)
        if code == 0 and target.is_file():
            prep.checkpoints[quant] = target
        else:
            prep.errors[quant] = f"quantize: {err if code is None else f'exit {code}'}: {_tail(err or out)}"
    return prep


def run_rows(prep: Prepared, *, quants: tuple[str, ...], prompt_len: int, new_tokens: int, samples: int,
             group_size: int, device: str, timeout_s: float, batch: int = 1, log=print,
             known: dict[str, Any] | None = None) -> list[GptFastRow]:
    """One gpt-fast row per quant, each its own subprocess, within `timeout_s` together; every row
    records gpt-fast's commit, and a quant whose checkpoint could not be made keeps that error;
    `known`: fields every row starts with (the bench's model and request sizes)."""
    import time

    started = time.perf_counter()
    rows: list[GptFastRow] = []
    for quant in quants:
        base = GptFastRow(**(known or {}), engine=ENGINE, quant=quant, **prep.base, **prep.extra.get(quant, {}),
                          group_size=group_size if quant == "int4" else None)
        if quant in prep.errors:
            rows.append(base.update(status="error", reason=prep.errors[quant]))
            continue
        left = timeout_s - (time.perf_counter() - started)
        if left <= 10:
            rows.append(base.update(status="skipped", reason=f"not started: {left:.0f} s left of gpt-fast's time"))
            continue
        run = PeerRun(Path(prep.base["peer_checkout"]), prep.checkpoints[quant], quant, prompt_len, new_tokens, samples,
                      group_size, device, batch)
        log(f"gpt-fast[{quant}] batch {batch}: running ({left:.0f} s left)")
        row = run_row(run, left, base)
        log(f"gpt-fast[{quant}]: {row.status}"
            + (f" {row.request_tok_s:.1f} tok/s" if row.get("request_tok_s") else f": {row.reason}"))
        rows.append(row)
    return rows
