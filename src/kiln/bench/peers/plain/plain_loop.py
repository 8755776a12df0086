"""The LLM training loop a user writes by hand around transformers, the row kiln must beat:

    model = LlamaForCausalLM.from_pretrained(dir)           # or from_config
    model = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr, betas, eps, weight_decay, fused=True)
    for x in batches:
        with torch.autocast("cuda", torch.bfloat16):
            loss = model(input_ids=x, labels=x).loss        # HF shifts the labels itself
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        opt.step(); opt.zero_grad(set_to_none=True); sched.step()

It imports torch and transformers only (no kiln training code), so it measures what those two give
without kiln. `write_initial_weights` makes the Hugging Face directory every row of the bench
starts from (transformers' own initialisation, seeded), so all rows train the same weights.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor


@dataclass(frozen=True)
class Hyper:
    """The optimisation every row of the bench uses."""

    lr: float = 1e-4
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.0
    """0: torchtitan decays every parameter and kiln only matrices and embeddings; with no decay all
    rows do the same arithmetic."""
    warmup_steps: int = 25
    """Linear warm-up: step i (from 0) runs at lr * (i + 1) / warmup_steps, then lr stays constant."""
    max_norm: float = 1.0
    """Gradient clipping of the global norm."""


def lr_factor(step: int, warmup_steps: int) -> float:
    return (step + 1) / warmup_steps if step < warmup_steps else 1.0


def write_initial_weights(config_fields: dict[str, Any], directory: Path, *, seed: int,
                          device: torch.device | str) -> Path:
    """A transformers model built from `config_fields` (a config.json's fields) with its own
    initialisation under `seed`, saved as `directory/{config.json, model.safetensors}` in fp32."""
    import transformers

    fields = {k: v for k, v in config_fields.items() if k != "model_type"}
    config = transformers.AutoConfig.for_model(config_fields["model_type"], **fields)
    torch.manual_seed(seed)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(directory), safe_serialization=True, max_shard_size="1000GB")  # one file
    del model
    return directory


class PlainLoop:
    """`step(inputs, targets)` runs one optimizer step the hand-written way and returns the loss
    (a device tensor). `targets` is ignored: the labels are the inputs, shifted inside the model."""

    def __init__(self, weights_dir: Path, device: torch.device, hyper: Hyper, *, compile: bool = True,
                 autocast_dtype: torch.dtype | None = torch.bfloat16, compile_mode: str | None = None):
        import transformers

        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(weights_dir), dtype=torch.float32, attn_implementation="sdpa", local_files_only=True).to(device)
        model.config.use_cache = False
        model.train()
        self.model = model
        self.device = device
        self.forward = torch.compile(model, mode=compile_mode) if compile else model
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=hyper.lr, betas=hyper.betas, eps=hyper.eps,
                                           weight_decay=hyper.weight_decay, fused=device.type == "cuda")
        warmup = hyper.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: lr_factor(s, warmup) if warmup
                                                           else 1.0)
        self.max_norm = hyper.max_norm
        self.autocast_dtype = autocast_dtype
        self.config = {"model": type(model).__name__, "compile": compile, "compile_mode": compile_mode,
                       "autocast": str(autocast_dtype).removeprefix("torch.") if autocast_dtype else None,
                       "optimizer": f"AdamW(fused={device.type == 'cuda'})", "attn_implementation": "sdpa",
                       "labels": "input_ids (shifted inside the model)", "transformers": transformers.__version__}

    def num_params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def step(self, inputs: Tensor, targets: Tensor | None = None) -> Tensor:
        if self.autocast_dtype is not None:
            with torch.autocast(self.device.type, dtype=self.autocast_dtype):
                loss = self.forward(input_ids=inputs, labels=inputs).loss
        else:
            loss = self.forward(input_ids=inputs, labels=inputs).loss
        loss.backward()
        if self.max_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return loss.detach()


def plain_runner(weights_dir: Path, device: torch.device, hyper: Hyper, **kwargs) -> tuple[Callable, dict, int]:
    """(step function, its recorded config, parameter count)."""
    loop = PlainLoop(weights_dir, device, hyper, **kwargs)
    return loop.step, loop.config, loop.num_params()
