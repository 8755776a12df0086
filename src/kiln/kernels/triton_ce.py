"""`training.ce_kernel=triton`: next-token cross-entropy on the logits through kiln's kernels.

The model computes its logits as with `plain`; the loss then goes through one autograd function
over two opaque ops: `kiln::ce_rows` (per-row loss and log-sum-exp, fp32, one pass over the logits)
and `kiln::ce_rows_backward` (softmax minus one-hot, times the row's gradient, in the logits'
dtype: one read and one write). On CUDA they run kiln's Triton kernels
(kiln.kernels.triton_ce_kernel); elsewhere the same arithmetic as PyTorch ops. Unlike `plain` under
autocast, no fp32 copy of the logits is made: the kernels convert a block at a time.

The mean is over the targets in [0, V), so IGNORE_INDEX (-100) is left out as `F.cross_entropy`
leaves it out; with every target ignored the loss is 0 (F.cross_entropy gives NaN).
"""

from __future__ import annotations

import torch
from torch import Tensor

IGNORE_INDEX = -100


def _valid(targets: Tensor, vocab: int) -> Tensor:
    return (targets >= 0) & (targets < vocab)


def _reference_rows(logits: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    x = logits.float()
    lse = torch.logsumexp(x, dim=-1)
    valid = _valid(targets, x.shape[-1])
    picked = x.gather(1, torch.where(valid, targets, 0)[:, None]).squeeze(1)
    return torch.where(valid, lse - picked, 0.0), lse


def _reference_backward(logits: Tensor, targets: Tensor, lse: Tensor, grad_rows: Tensor) -> Tensor:
    vocab = logits.shape[-1]
    onehot = torch.arange(vocab, device=logits.device)[None, :] == targets[:, None]
    g = torch.where(_valid(targets, vocab), grad_rows, 0.0)
    return (((logits.float() - lse[:, None]).exp() - onehot.float()) * g[:, None]).to(logits.dtype)


def _triton_ready(logits: Tensor) -> bool:
    return logits.is_cuda and logits.dtype in (torch.bfloat16, torch.float16, torch.float32)


@torch.library.custom_op("kiln::ce_rows", mutates_args=())
def ce_rows(logits: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    """(loss per row, log-sum-exp per row), fp32 [rows], of logits [rows, V] and targets [rows]."""
    if _triton_ready(logits):
        from kiln.kernels.triton_ce_kernel import ce_forward

        return ce_forward(logits.contiguous(), targets.contiguous())
    return _reference_rows(logits, targets)


@ce_rows.register_fake
def _(logits: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    rows = logits.shape[0]
    return logits.new_empty(rows, dtype=torch.float32), logits.new_empty(rows, dtype=torch.float32)


@torch.library.custom_op("kiln::ce_rows_backward", mutates_args=())
def ce_rows_backward(logits: Tensor, targets: Tensor, lse: Tensor, grad_rows: Tensor) -> Tensor:
    """The gradient of sum(grad_rows * loss rows) with respect to the logits, in their dtype."""
    grad_rows = grad_rows.float().contiguous()
    if _triton_ready(logits):
        from kiln.kernels.triton_ce_kernel import ce_backward

        return ce_backward(logits.contiguous(), targets.contiguous(), lse.contiguous(), grad_rows)
    return _reference_backward(logits, targets, lse, grad_rows)


@ce_rows_backward.register_fake
def _(logits: Tensor, targets: Tensor, lse: Tensor, grad_rows: Tensor) -> Tensor:
    return torch.empty_like(logits)


class _CrossEntropyRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: Tensor, targets: Tensor) -> Tensor:
        loss, lse = ce_rows(logits, targets)
        ctx.save_for_backward(logits, targets, lse)
        return loss

    @staticmethod
    def backward(ctx, grad_rows: Tensor):
        logits, targets, lse = ctx.saved_tensors
        return ce_rows_backward(logits, targets, lse, grad_rows), None


def triton_cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean cross-entropy of logits [..., V] against targets [...] over non-ignored targets (fp32)."""
    logits, targets = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
    rows = _CrossEntropyRows.apply(logits, targets)
    count = _valid(targets, logits.shape[-1]).sum().clamp(min=1)
    return rows.sum() / count
