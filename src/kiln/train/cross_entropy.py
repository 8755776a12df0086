"""Next-token cross-entropy through the output layer, four ways (`training.ce_kernel`).

- `plain`: `lm_head` gives the logits [tokens x vocab], then `F.cross_entropy` (under autocast it
  works on an fp32 copy of them). At Llama-3's vocabulary (128,256) and 16,384 tokens a step that
  is 4 GiB of bf16 logits, 8 GiB of fp32 copy and as much again for their gradient.
- `chunked`: kiln's fused linear + cross-entropy. Tokens go through the output layer a chunk at a
  time; each chunk's logits give its loss *and* its gradients (softmax minus one-hot) at once, so
  no [tokens x vocab] tensor outlives its chunk and the logits are computed once (the same three
  matmuls as plain: logits, grad of the hidden states, grad of the weight). Exact: the same
  arithmetic as plain, except that the weight gradient is summed over chunks in the matmul dtype
  (with bf16 matmuls it is rounded to bf16 once per chunk, plain rounds it once).
- `liger`: Liger-Kernel's fused linear cross-entropy (the same idea in Triton kernels), when the
  `kernels` extra is installed.
- `triton`: the logits as `plain`, then the loss and its gradient through kiln's Triton kernels
  (kiln.kernels.triton_ce): one pass over the logits forward, one read and one write backward, no
  fp32 copy. Any causal LM (it needs the logits only).

`auto` is `chunked` for models that expose their hidden states (`llama:`), else `plain`: it
removes the largest activation of an LLM step at no extra matmul, needs no extra package, works
on every device, and was the faster fused kernel where both were measured (the llm_train
results README). benchmarks/llm_train_features.py measures the
kernels alone (time, memory, differences from `plain`).

Targets equal to IGNORE_INDEX (-100, as in F.cross_entropy) are left out of the loss and its mean.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from kiln.errors import ConfigError

KERNELS = ("plain", "chunked", "liger", "triton")
IGNORE_INDEX = -100
LIGER_HINT = "pip install 'kiln[kernels]' (liger-kernel)"
# Tokens per chunk: as many as keep one chunk's fp32 logits within this many bytes.
CHUNK_LOGIT_BYTES = 2**30


def resolve_ce_kernel(name: str, hidden_states: bool) -> str:
    """The kernel `training.ce_kernel=name` means for a model (`hidden_states`: it can return its
    final hidden states and names its output layer, see BuiltModel.hidden_states)."""
    if name == "auto":
        return "chunked" if hidden_states else "plain"
    if name not in KERNELS:
        raise ConfigError("training.ce_kernel", f"unknown value {name!r}", ("auto", *KERNELS))
    if name not in ("plain", "triton") and not hidden_states:
        raise ConfigError("training.ce_kernel", f"{name!r} needs a model that gives its hidden states and output "
                          "layer (model.name=llama:...); this model returns only logits", ("auto", "plain", "triton"))
    if name == "liger":
        liger_function()
    return name


def liger_function() -> Callable:
    try:
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy
    except ImportError as exc:
        raise ConfigError("training.ce_kernel", f"'liger' needs Liger-Kernel, which does not import ({exc}); "
                          f"{LIGER_HINT}", ("auto", "plain", "chunked")) from None
    return liger_fused_linear_cross_entropy


def chunk_tokens(vocab_size: int) -> int:
    """Tokens per chunk: a power of two whose fp32 logits fit in CHUNK_LOGIT_BYTES (2048 at a
    128,256 vocabulary), at least 64."""
    fit = max(1, CHUNK_LOGIT_BYTES // (4 * vocab_size))
    return max(64, 1 << (fit.bit_length() - 1))


def _chunk_loss_and_grad(logits: Tensor, targets: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
    """Summed loss of one chunk (in fp32, or fp64 for fp64 logits) and d(summed loss)/d(logits) in
    the logits' dtype: softmax minus one-hot, zero on the rows of ignored targets (their
    log-sum-exp is taken as +inf, so no host sync is needed to find them)."""
    logits32 = logits.to(torch.promote_types(logits.dtype, torch.float32))
    lse = torch.logsumexp(logits32, dim=-1)
    picked = logits32.gather(1, targets[:, None]).squeeze(1)
    loss = torch.where(valid, lse - picked, 0.0).sum()
    grad = (logits32 - torch.where(valid, lse, torch.inf)[:, None]).exp()
    grad = grad.scatter_add(1, targets[:, None], -valid[:, None].to(grad.dtype))
    return loss, grad.to(logits.dtype)


_compiled: dict[str, Callable] = {}


def _chunk_kernel(device: torch.device) -> Callable:
    """`_chunk_loss_and_grad`, compiled on CUDA into one fused kernel pass over a chunk's logits
    (eagerly it is several passes over fp32 copies, a sizeable share of an LLM step); eager
    elsewhere, or when compiling it fails (logged once). Inside a compiled region (compile.scope
    `model+loss` or `step`) the plain function is traced and fused with the rest; under a
    dispatch mode (FLOP counting, SAC), which torch.compile cannot run in, it runs eagerly."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    if (device.type != "cuda" or _compiled.get("failed") or torch.compiler.is_compiling()
            or _get_current_dispatch_mode() is not None):
        return _chunk_loss_and_grad
    if "fn" not in _compiled:
        compiled = torch.compile(_chunk_loss_and_grad, dynamic=False, fullgraph=True)

        def run(logits: Tensor, targets: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
            if _compiled.get("failed"):
                return _chunk_loss_and_grad(logits, targets, valid)
            try:
                return compiled(logits, targets, valid)
            except torch.OutOfMemoryError:  # the batch does not fit: not a compiler failure, the caller decides
                raise
            except Exception as exc:  # no Triton, a compiler bug: correct eager code instead
                _compiled["failed"] = True
                logging.getLogger("kiln.train").warning(
                    "cross-entropy: compiling the chunk kernel failed (%s); running it eagerly", str(exc)[:200])
                return _chunk_loss_and_grad(logits, targets, valid)

        _compiled["fn"] = run
    return _compiled["fn"]


class ChunkedLinearCrossEntropy(torch.autograd.Function):
    """mean over valid tokens of cross_entropy(h @ weight.T, targets), a chunk of tokens at a time.

    `h` [N, D] and `weight` [V, D] share one dtype (the caller casts them, so autograd carries the
    cast back); the gradients are computed in forward, chunk by chunk, and only scaled in backward.
    """

    @staticmethod
    def forward(ctx, h: Tensor, weight: Tensor, targets: Tensor, chunk: int) -> Tensor:
        valid = targets != IGNORE_INDEX
        safe = torch.where(valid, targets, 0)
        count = valid.sum().clamp(min=1)
        want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.empty_like(h) if want_h else None
        grad_w = torch.zeros_like(weight) if want_w else None
        total = torch.zeros((), dtype=torch.promote_types(h.dtype, torch.float32), device=h.device)
        kernel = _chunk_kernel(h.device)
        for start in range(0, h.shape[0], chunk):
            end = min(start + chunk, h.shape[0])
            hc = h[start:end]
            loss, grad = kernel(hc @ weight.t(), safe[start:end], valid[start:end])
            total = total + loss
            if want_h:
                grad_h[start:end] = grad @ weight
            if want_w:
                torch.addmm(grad_w, grad.t(), hc, out=grad_w)  # addmm_ in effect; FLOP counters see addmm
        ctx.save_for_backward(grad_h, grad_w, count)
        ctx.backward_done = False
        return total / count

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        if ctx.backward_done:  # the gradients below are scaled in place: a second backward would rescale them
            raise RuntimeError("the chunked cross-entropy supports one backward per forward (no retain_graph reuse)")
        ctx.backward_done = True
        grad_h, grad_w, count = ctx.saved_tensors
        scale = grad_out / count
        # In place: a second [vocab x dim] (and [tokens x dim]) buffer at the peak of backward is
        # what this kernel exists to avoid.
        return (None if grad_h is None else grad_h.mul_(scale.to(grad_h.dtype)),
                None if grad_w is None else grad_w.mul_(scale.to(grad_w.dtype)), None, None)


def _compute_dtype(x: Tensor) -> torch.dtype:
    """The dtype the output layer's matmul runs in: autocast's when it is on, else the input's."""
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return x.dtype


def linear_cross_entropy(h: Tensor, weight: Tensor, targets: Tensor, kernel: str, chunk: int | None = None) -> Tensor:
    """Mean next-token loss of hidden states `h` [..., D] through the output weight [V, D]."""
    h, targets = h.reshape(-1, h.shape[-1]), targets.reshape(-1)
    dtype = _compute_dtype(h)
    if kernel == "plain":
        return F.cross_entropy(F.linear(h, weight), targets, ignore_index=IGNORE_INDEX)
    h, weight = h.to(dtype), weight.to(dtype)
    if kernel == "chunked":
        return ChunkedLinearCrossEntropy.apply(h, weight, targets, chunk or chunk_tokens(weight.shape[0]))
    if kernel == "liger":
        return liger_function()(h, weight, targets, ignore_index=IGNORE_INDEX)
    raise ValueError(f"unknown cross-entropy kernel {kernel!r}")


def output_layer(model: torch.nn.Module) -> torch.nn.Linear:
    """The output layer of a (possibly DDP-wrapped) model that exposes `lm_head`."""
    inner = getattr(model, "module", model)  # DDP keeps the model in .module
    return inner.lm_head


def hidden_state_loss(model: torch.nn.Module, kernel: str) -> Callable[[Tensor, Tensor], Tensor]:
    """(inputs, targets) -> loss for a model whose forward takes `hidden=True` (BuiltModel.hidden_states)."""

    def forward_loss(inputs: Tensor, targets: Tensor) -> Tensor:
        h = model(inputs, hidden=True)
        return linear_cross_entropy(h, output_layer(model).weight, targets, kernel)

    return forward_loss
