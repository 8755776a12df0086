"""Loss functions by task, and the one place that calls the model on a batch."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from kiln.kernels.triton_ce import triton_cross_entropy
from kiln.train.cross_entropy import hidden_state_loss


def logits_of(output) -> Tensor:
    # HF models return a ModelOutput with .logits; plain modules return the tensor itself.
    if isinstance(output, Tensor):
        return output
    logits = getattr(output, "logits", None)
    if logits is None and isinstance(output, dict):
        logits = output.get("logits")
    if logits is None:
        raise TypeError(f"model output {type(output).__name__} has no logits; set model.task=custom if it returns a loss")
    return logits


def _own_loss(output) -> Tensor:
    if isinstance(output, Tensor):
        loss = output
    elif isinstance(output, dict):
        loss = output.get("loss")
    else:
        loss = getattr(output, "loss", None)
    if not isinstance(loss, Tensor) or loss.dim() != 0:
        raise TypeError("model.task=custom: the model must return a scalar loss tensor (or an object/dict with .loss)")
    return loss


def classification_loss(output, targets: Tensor) -> Tensor:
    return F.cross_entropy(logits_of(output), targets)


def next_token_loss(output, targets: Tensor) -> Tensor:
    # Data yields targets already shifted by one token, so this is plain cross-entropy per position.
    logits = logits_of(output)
    return F.cross_entropy(logits.flatten(0, -2), targets.flatten())


def build_forward_loss(model: torch.nn.Module, task: str, ce_kernel: str = "plain") -> Callable[[Tensor, Tensor], Tensor]:
    """A function (inputs, targets) -> scalar loss for the task; `custom` models get both tensors.
    `ce_kernel` (`chunked`, `liger`): a causal LM's loss from its hidden states through a fused
    linear + cross-entropy (kiln.train.cross_entropy; the model must take `hidden=True`);
    `triton`: from its logits through kiln's cross-entropy kernels (kiln.kernels.triton_ce)."""
    if task == "causal_lm" and ce_kernel == "triton":
        return lambda inputs, targets: triton_cross_entropy(logits_of(model(inputs)), targets)
    if task == "causal_lm" and ce_kernel != "plain":
        return hidden_state_loss(model, ce_kernel)
    if task == "custom":
        return lambda inputs, targets: _own_loss(model(inputs, targets))
    if task == "causal_lm":
        return lambda inputs, targets: next_token_loss(model(inputs), targets)
    if task == "classification":
        return lambda inputs, targets: classification_loss(model(inputs), targets)
    raise ValueError(f"unknown task {task!r}")


def build_eval_fn(model: torch.nn.Module, task: str) -> Callable[[Tensor, Tensor], tuple[Tensor, Tensor | None]]:
    """(inputs, targets) -> (loss, number of argmax hits or None for `custom`)."""
    if task == "custom":
        return lambda inputs, targets: (_own_loss(model(inputs, targets)), None)
    loss_of = next_token_loss if task == "causal_lm" else classification_loss

    def eval_fn(inputs: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        output = model(inputs)
        hits = (logits_of(output).argmax(dim=-1) == targets).sum()
        return loss_of(output, targets), hits

    return eval_fn
