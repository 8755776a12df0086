"""The activation and loss terms of the GPU memory plan (kiln.train.activation_bytes) against what a CPU
forward of kiln's decoder really leaves alive for backward: every tensor the forward creates is
tracked by storage, and after the forward the storages still alive (parameters and the returned
output aside) are what autograd, checkpointing's caches and the loss keep. Exact, byte for byte."""

from __future__ import annotations

import contextlib
import gc

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

from kiln.models.llama import build_llama
from kiln.train.activation_bytes import (
    DecoderDims,
    Micro,
    Widths,
    activations_saved,
    block_saved,
    loss_saved,
    recompute_bytes,
)
from kiln.train.activation_checkpoint import apply_activation_checkpointing
from kiln.train.cross_entropy import hidden_state_loss
from kiln.train.swiglu import apply_swiglu_kernel

B, T = 2, 32
TINY = {"num_hidden_layers": 2}  # llama-tiny: dim 64, 4 heads of 16 (2 kv), MLP 128, vocab 512


class _Created(TorchDispatchMode):
    """Every storage an op outputs during the forward (weakly held)."""

    def __init__(self):
        super().__init__()
        self.refs: list[StorageWeakRef] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.refs.append(StorageWeakRef(t.untyped_storage()))
        return out


def _alive_after_forward(mode: str, dtype: torch.dtype, *, autocast: bool = False, swiglu: str = "plain",
                         loss: str | None = None) -> tuple[int, DecoderDims]:
    """Bytes of the storages a forward (and loss, when `loss` names its kernel) leaves alive."""
    torch.manual_seed(0)
    built = build_llama("llama-tiny", TINY, "tiny", device="cpu")
    model = built.module.to(dtype)
    apply_swiglu_kernel(model, swiglu)
    apply_activation_checkpointing(built.blocks, mode)
    tokens = torch.randint(0, 512, (B, T))
    params = {StorageWeakRef(p.untyped_storage()).cdata for p in model.parameters()}
    created = _Created()
    cast = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with created, cast:
        out = hidden_state_loss(model, loss)(tokens, tokens) if loss else model(tokens, hidden=True)
    gc.collect()
    skip = params | {StorageWeakRef(t.untyped_storage()).cdata for t in (out, tokens)}
    alive = {}
    for ref in created.refs:
        if not ref.expired() and ref.cdata not in skip:
            alive[ref.cdata] = torch.UntypedStorage._new_with_weak_ptr(ref.cdata).nbytes()
    c = model.config
    dims = DecoderDims(c.n_layers, c.dim, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn_dim, c.vocab_size)
    return sum(alive.values()), dims


MODES = ["none", "selective", "full"]


def _block_matmul_params(d: DecoderDims) -> int:
    return d.dim * (d.heads + 2 * d.kv_heads) * d.head_dim + d.heads * d.head_dim * d.dim + 3 * d.dim * d.ffn_dim


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("swiglu", ["plain", "fused"])
def test_bf16_model_as_fsdp2_runs_it(mode, swiglu):
    """16-bit weights, no autocast (FSDP2's gathered bf16 parameters): residual and matmuls in bf16."""
    alive, dims = _alive_after_forward(mode, torch.bfloat16, swiglu=swiglu)
    assert alive == activations_saved(dims, Widths(2, 2), Micro(B, T, swiglu), mode)


@pytest.mark.parametrize("mode", MODES)
def test_fp32_model_under_bf16_autocast(mode):
    """One process under bf16-mixed: an fp32 residual stream, bf16 matmul outputs. Without
    checkpointing the matmuls also keep autocast's bf16 copy of each weight: the plan's separate
    `autocast weight copies` part, subtracted here."""
    alive, dims = _alive_after_forward(mode, torch.float32, autocast=True)
    weights = dims.layers * _block_matmul_params(dims) * 2 if mode == "none" else 0
    assert alive - weights == activations_saved(dims, Widths(4, 2), Micro(B, T), mode)


@pytest.mark.parametrize("mode", MODES)
def test_fp32_model(mode):
    alive, dims = _alive_after_forward(mode, torch.float32)
    assert alive == activations_saved(dims, Widths(4, 4), Micro(B, T), mode)


@pytest.mark.parametrize("kernel", ["chunked", "plain"])
def test_loss_terms(kernel):
    """The loss's saved bytes: what the forward + loss leaves alive minus the activations. Under
    autocast plain cross-entropy's matmul also keeps the output weight's bf16 copy (the plan's
    `autocast weight copies`), subtracted here."""
    alive, dims = _alive_after_forward("selective", torch.bfloat16, loss=kernel)
    activations = activations_saved(dims, Widths(2, 2), Micro(B, T), "selective")
    assert alive - activations == loss_saved(dims, Widths(2, 2), B * T, kernel, autocast=False)
    alive, dims = _alive_after_forward("full", torch.float32, autocast=True, loss=kernel)
    activations = activations_saved(dims, Widths(4, 2), Micro(B, T), "full")
    weight_copy = dims.vocab * dims.dim * 2 if kernel == "plain" else 0
    assert alive - activations - weight_copy == loss_saved(dims, Widths(4, 2), B * T, kernel, autocast=True)


def test_arithmetic_by_hand():
    """The 8B shape at seq 8192, bf16, selective: 801 MiB a block (input 64, q/k/v 96, attention 64
    + 1 of statistics, out-projection 64, gate/up 448, down 64)."""
    dims = DecoderDims(32, 4096, 32, 8, 128, 14336, 128256)
    assert block_saved(dims, Widths(2, 2), Micro(1, 8192), "selective") == 801 * 2**20
    assert block_saved(dims, Widths(2, 2), Micro(1, 8192), "full") == 64 * 2**20
    assert block_saved(dims, Widths(2, 2), Micro(1, 8192, compiled=True), "selective") == 737 * 2**20  # no down output
    assert block_saved(dims, Widths(2, 2), Micro(1, 8192, attention="efficient"), "selective") == 801 * 2**20
    # no checkpointing, fused SwiGLU: two norms of 384 MiB + 32 KiB (two fp32 copies, bf16 in and out, rsqrt), q/k/v 96, rotated q/k 80, attention 65, MLP 672
    none = block_saved(dims, Widths(2, 2), Micro(1, 8192, "fused"), "none")
    assert none == 2 * (384 * 2**20 + 8192 * 4) + (96 + 80 + 65 + 672) * 2**20
    # backward recomputes what a selective block did not keep (944 MiB + 64 KiB) and makes the gate/up gradient
    assert recompute_bytes(dims, Widths(2, 2), Micro(1, 8192, "fused"), "selective") == \
        none - 801 * 2**20 + 64 * 2**20 + 448 * 2**20


def _alive_after_compiled_forward(mode: str, swiglu: str) -> tuple[int, DecoderDims]:
    """Bytes of what compiled blocks (AOT autograd's min-cut partitioner, the one inductor uses, with
    eager kernels) keep alive after the forward: their saved tensors and the block inputs among them,
    the checkpoint's CPU RNG states and the rotary cos/sin (both held outside the blocks) aside."""
    from functorch.compile import make_boxed_func, min_cut_rematerialization_partition
    from torch._dynamo.backends.common import aot_autograd

    torch._dynamo.reset()
    kept: list[tuple[StorageWeakRef, torch.dtype]] = []

    def forward_compiler(gm, example_inputs):
        def run(args):
            outs = gm(*args)
            kept.extend((StorageWeakRef(t.untyped_storage()), t.dtype) for t in outs if isinstance(t, torch.Tensor))
            return outs

        run._boxed_call = True
        return run

    backend = aot_autograd(fw_compiler=forward_compiler, bw_compiler=make_boxed_func,
                           partition_fn=min_cut_rematerialization_partition)
    torch.manual_seed(0)
    built = build_llama("llama-tiny", TINY, "tiny", device="cpu")
    model = built.module.to(torch.bfloat16)
    apply_swiglu_kernel(model, swiglu)
    apply_activation_checkpointing(built.blocks, mode)
    for block in built.blocks:
        block.compile(backend=backend)
    tokens = torch.randint(0, 512, (B, T))
    params = {StorageWeakRef(p.untyped_storage()).cdata for p in model.parameters()}
    out = model(tokens, hidden=True)
    gc.collect()
    skip = params | {StorageWeakRef(out.untyped_storage()).cdata}
    alive = {ref.cdata: torch.UntypedStorage._new_with_weak_ptr(ref.cdata).nbytes() for ref, dtype in kept
             if not ref.expired() and ref.cdata not in skip and dtype != torch.uint8}  # uint8: RNG states
    c = model.config
    dims = DecoderDims(c.n_layers, c.dim, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn_dim, c.vocab_size)
    torch._dynamo.reset()
    return sum(alive.values()) - 2 * B * T * c.head_dim * 2, dims  # less the cos/sin the blocks take as inputs


@pytest.mark.parametrize(("mode", "swiglu"), [("none", "plain"), ("none", "fused"), ("selective", "fused"),
                                              ("full", "fused")])
def test_compiled_blocks(mode, swiglu):
    alive, dims = _alive_after_compiled_forward(mode, swiglu)
    assert alive == dims.layers * block_saved(dims, Widths(2, 2), Micro(B, T, swiglu, compiled=True), mode)
