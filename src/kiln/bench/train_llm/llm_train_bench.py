"""`kiln bench train-llm`: kiln's LLM training recipes, the plain transformers loop and torchtitan
side by side in one call, on one model shape, sequence, batch, data, weights and GPU.

Every row trains `steps` optimizer steps from the same initial weights on the same batches (one
corpus and tokenizer, kiln.bench.train_llm.llm_train_data) with the same optimisation (AdamW, warm-up then a
constant learning rate, clipping: kiln.bench.peers.plain.plain_loop.Hyper), so their losses after the
same steps show they train the same thing, and their step times what each costs. Rows run one
after another (each holds a whole training state; two 1B states and their activations do not fit
beside each other on one GPU); the matmul peak is measured before and after them, so drift over
the call shows.

Figures per row: median step time after the first `warmup` steps, tokens/s, model FLOP/s and MFU
against the GPU's datasheet peak (kiln's table) and against the best matmul measured in this
process at the rows' precision, peak memory, first and last loss, and the exact config. Model FLOPs
per token, the usual analytic count (kiln.bench.formulas.flops_per_token): 6 x parameters (the LM
head included, the embedding table not) + 12 x layers x hidden x sequence (attention scores and
values).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from kiln.bench.ceilings import matmul_dtype, measure_best_matmul
from kiln.bench.formulas import peak_fraction
from kiln.bench.peers.plain.plain_loop import Hyper
from kiln.monitor.flops import peak_flops_for_name
from kiln.timing import Timing


@dataclass(frozen=True)
class RowSpec:
    name: str
    kind: str
    """`kiln` (a recipe) or the name of a train-llm peer (kiln.bench.peers.table)."""
    overrides: tuple[str, ...] = ()
    invalid: str | None = None
    """Why the recipe's config was refused (the row is reported as skipped)."""


@dataclass
class TrainLlmOptions:
    model: str
    hf: dict[str, Any]
    """The model's config.json fields (after untying, when a row needs it)."""
    seq_len: int
    batch: int
    steps: int
    warmup: int
    rows: list[RowSpec]
    hyper: Hyper = field(default_factory=Hyper)
    precision: str = "bf16-mixed"
    seed: int = 0
    device: str = "auto"
    kiln_family: str = "llama"
    data_dir: Path | None = None
    deadline_s: float | None = None
    torchtitan_overrides: list[str] = field(default_factory=list)
    torchtitan_timeout_s: float = 600.0
    loss_tol: float = 0.02
    baseline: str | None = None
    """The row every other is compared with (speed, final losses); None: plain, else the first."""
    plain_compile: bool = True
    """Compile the plain loop's model (torch.compile(model), as the hand-written loop does)."""
    nproc: int = 1
    """Ranks of every row (--nproc-per-node): 1 runs kiln's rows and the plain loop in this process;
    more run each row under torchrun, `batch` sequences per rank (global batch nproc x batch)."""
    row_timeout_s: float = 900.0
    """Seconds a launched kiln or plain row may take (torchtitan has its own limit)."""
    plain_ac: str = "none"
    """The plain FSDP2 loop's activation checkpointing at nproc > 1: none or full."""
    notes: list[str] = field(default_factory=list)


def spec_peak(device: torch.device, precision: str) -> tuple[float | None, str]:
    """The GPU's datasheet dense peak at the rows' precision (kiln's table; fp32 on TF32, as kiln
    trains by default) and where it came from."""
    if device.type != "cuda":
        return None, "cpu: no datasheet peak"
    return peak_flops_for_name(torch.cuda.get_device_name(device), precision, tf32=True)


def matmul_peak(device: torch.device, precision: str) -> float:
    """The best matmul FLOP/s measured here at the rows' matrix-unit dtype (several sizes)."""
    return measure_best_matmul(device, matmul_dtype(precision, True))[0]


def base_overrides(opts: TrainLlmOptions, model_name: str, tokens_path: Path, device: torch.device) -> list[str]:
    """The config every kiln row starts from: the bench's model, data, steps and optimisation."""
    h = opts.hyper
    return [f"model.name={model_name}", "data.source=tokens", f"data.path={tokens_path}", "data.token_dtype=uint32",
            f"data.seq_len={opts.seq_len}", f"data.batch_size={opts.batch}", f"training.steps={opts.steps}",
            f"training.seed={opts.seed}", f"training.device={device}", f"training.grad_clip={h.max_norm}",
            "optim.name=adamw", f"optim.lr={h.lr}", f"optim.betas=[{h.betas[0]}, {h.betas[1]}]", f"optim.eps={h.eps}",
            f"optim.weight_decay={h.weight_decay}", f"optim.warmup_steps={h.warmup_steps}", "optim.schedule=constant",
            f"precision.policy={opts.precision}"]


def figures(step_s: list[float], warmup: int, tokens_per_step: int, fpt: int, spec: float | None,
            matmul: float | None, gpus: int = 1) -> dict[str, Any]:
    """Step time, tokens/s (in all and per GPU), FLOP/s per GPU and both MFUs from the per-step
    seconds (after `warmup` steps; `step_s[k]` is step k + 2, the first step being timed on its
    own); `tokens_per_step` is the global batch's tokens over `gpus` ranks, `spec` and `matmul` one
    GPU's peaks. Empty when no step was timed."""
    timed = step_s[max(0, warmup - 1):] or step_s
    if not timed:
        return {}
    timing = Timing(tuple(timed))  # kiln's one definition of median and p10/p90
    median = timing.median_s
    flops = fpt * tokens_per_step / median
    return dict(step_ms=median * 1e3, step_ms_p10=timing.quantile_s(0.1) * 1e3,
                step_ms_p90=timing.quantile_s(0.9) * 1e3, timed_steps=len(timed),
                tokens_per_s=tokens_per_step / median, tokens_per_s_per_gpu=tokens_per_step / median / gpus,
                tflops=flops / gpus / 1e12,
                mfu_spec=peak_fraction(fpt * tokens_per_step, median, spec * gpus if spec else None),
                mfu_matmul=peak_fraction(fpt * tokens_per_step, median, matmul * gpus if matmul else None))



def deadline_left(start: float, deadline_s: float | None) -> float | None:
    return None if deadline_s is None else deadline_s - (time.monotonic() - start)
