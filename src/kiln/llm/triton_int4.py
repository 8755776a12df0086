"""int4 decode matmuls in Triton (`--quant int4@triton`): kiln's int4 layout read by kiln's own
decode matrix-vector kernel (kiln.llm.triton_matvec, which also fuses the RMSNorm before a
projection and the residual add after it when the model's decode step asks for them).

The layout is `Int4FusedLinear`'s (kiln.llm.quant_torch): uint8 [out, in/2] with the first half
of the input features in the low nibbles and the second half in the high ones, and per group of
`group_size` inputs a scale and an offset (w = q * scale + offset), [out, in/group]. A program
reads a [BLOCK_N rows, groups, group / 4] tile of the bytes as int32 words per iteration, turns
each nibble into a float with a logical op and an add (no conversion instruction), multiplies it
with its x value, and applies each group's scale per word and its offset once per group (see
`_int4_tile` in kiln.llm.triton_matvec); small-output projections split their inputs over
several programs.

Why: torch's tinygemm kernel (torchao's int4 layout) pads the token to a 16-row tile and read its
int4 weights at ~1.3 TB/s on an H100 in the 3B decode profile (113 calls of ~10 us per step, two
thirds of the step). Measured so far this kernel is slower still (benchmarks/results/h100/llm/
decode_matvec): one-token matmuls of the 3B shapes take 1.60 ms per step against tinygemm's 1.27
(the first versions, which converted every nibble with a conversion instruction and kept 4-D
tiles that Triton routed through shared memory, took 1.87-2.19 ms), and fused into the model the
prologues cost more still: each x value is rebuilt by every thread that needs it, 16 times per
program with 64-row tiles (3B decode at 382 tok/s against 543-594 with tinygemm). torchao stays
the default int4 backend.

Longer inputs (prefill) dequantize the weight and call `linear`.

Tests run it on CPU through Triton's interpreter (TRITON_INTERPRET=1) with a fixed setting.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kiln.llm.quant_torch import Int4FusedLinear
from kiln.llm.triton_matvec import MAX_ROWS, launch


@torch.library.custom_op("kiln::int4_matvec", mutates_args=())
def int4_matvec(x: Tensor, packed: Tensor, scale: Tensor, offset: Tensor, group_size: int, bias: Tensor | None = None,
                norm_weight: Tensor | None = None, eps: float = 0.0, silu_mul: bool = False,
                residual: Tensor | None = None, setting: list[int] | None = None) -> Tensor:
    """x [M, K] (M <= MAX_ROWS) times the int4 weight (`Int4FusedLinear`'s buffers) -> [M, out] in
    x's dtype, with kiln::matvec's fused parts (norm, SwiGLU, bias, residual)."""
    return launch(x, packed, scale, offset, group_size, bias, norm_weight, eps, silu_mul, residual, setting)


@int4_matvec.register_fake
def _(x, packed, scale, offset, group_size, bias=None, norm_weight=None, eps=0.0, silu_mul=False, residual=None,
      setting=None):
    return x.new_empty(x.shape[0], packed.shape[0])


class Int4TritonLinear(Int4FusedLinear):
    """`Int4FusedLinear`'s layout; up to MAX_ROWS rows go through kiln's Triton kernel."""

    def forward(self, x: Tensor) -> Tensor:
        rows = x.numel() // self.in_features
        if rows > MAX_ROWS:
            return super().forward(x)
        y = torch.ops.kiln.int4_matvec(x.reshape(rows, self.in_features), self.weight, self.scale, self.offset,
                                       self.group_size, self.bias)
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return super().extra_repr().replace("int4 fused", "int4 triton")
