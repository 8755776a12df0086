"""kiln's own decode-step attention kernel (`--decode-attention triton`), written in Triton.

One decode step attends one query per head over the static cache [B, S, Hkv, D]. The keys are
split into chunks of consecutive slots; program (b * Hkv + kv head, chunk) loads the G query
heads of its key/value head as one [BLOCK_G, D] tile (G padded to 16 for the tensor cores), reads
its chunk of keys and values once for all G heads, and keeps a running softmax (max, sum, weighted
values) over it. It writes the chunk's normalised output and log-sum-exp and counts itself in
(an atomic per row and head); the last chunk to arrive combines all of them, so one launch does
the whole step; a row and head's only chunk (a large batch) writes its result directly. A
program walks only the blocks of its chunk that hold slots of its row's valid
range (from the row's first real slot, or a sliding window's, to the step's), so a row shorter
than the cache costs its own length; slots outside the range are masked out of the softmax, and
a looping program never lets their values reach the result (not even NaN; a one-block program, at
batch 1, uses its block as loaded: zeroing there cost batch 1's step time); chunks with none left
combine with weight 0.

Why: at batch 1 the matmul formulation becomes several inductor kernels per layer (the softmax
over ~1k slots runs on one thread block per head), and FlashAttention's split-KV kernel needs a
second kernel to combine its chunks. The chunk count is chosen so that B * Hkv * chunks programs
fill the GPU, and the valid range of each row (`start`, `pos`, a sliding window) is read from
device tensors, so shapes never change and the step stays one CUDA graph. The kernel is
registered as the custom op `kiln::decode_attention`, which torch.compile calls as an opaque
kernel.

`kiln::decode_attention_rope` (what a decode step runs for layers without q/k norms once
kiln.llm.kernels swaps it in) takes the q/k/v projection's output instead: every program computes
the RoPE angles of its row's position, rotates its query heads and its head's new key, the
program whose chunk holds the step's slot writes the new key and value into the cache, and the
slot's scores use them directly. This replaces three inductor kernels per layer (RoPE of q, RoPE
of k with its cache write, the value's cache write) and their launch gaps. Where each row and head
has several chunks it is launched with programmatic dependent launch (kiln.kernels.triton_launch.PDL;
one looping chunk each is not, `PDL_ONE_CHUNK`), so with `--decode-matvec triton` every kernel of
a layer is scheduled while the one before it ends; a program reads its first block, the position
and the angles before it waits (only this kernel writes a layer's cache; the step's own slot comes
from the projection), then the query; a looping program pipelines its blocks after the wait
(LOOP_STAGES). The op declares the caches it writes; inductor calls it on them in place
(tests/kernels/test_triton_decode.py checks that no copy is made).

Tests run it on CPU through Triton's interpreter (TRITON_INTERPRET=1, fp32); the GPU check is
benchmarks/decode_attention_check.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from kiln.kernels.triton_launch import arrival_counters, interpreting, pdl_enabled

TARGET_PROGRAMS = 256
"""Programs to aim for per step (~2 per SM on an H100's 132): chunks = this / (B * Hkv), at most
one per block of slots."""
ONE_CHUNK_FROM = 128
"""Rows x key/value heads from which each takes one chunk (about one looping program per SM), written
directly: at batch 16 with 8 key/value heads the step beat two chunks and their combine."""
PDL_ONE_CHUNK = False
"""Programmatic dependent launch also where each row and head is one chunk (looping programs, about
one per SM): off, as placed while int4's row kernel still ran they made the batch-16 step slower."""
BLOCK_S: int | None = None
"""Key slots per inner iteration (and the granularity of a chunk); None: `launch_settings` chooses.
Set (with NUM_WARPS) by benchmarks/decode_attention_bench.py's sweep."""
NUM_WARPS: int | None = None
"""Warps per program; None: `launch_settings` chooses."""
LOOP_BLOCK: int = 64
"""Slots per block where a program loops over several (a larger batch; launch_settings)."""
LOOP_STAGES: int | None = 3
"""Where a program loops over several blocks: N, Triton's software pipeline keeps N - 1 blocks in
flight through shared memory (`tl.range(num_stages=N)`) and the fused RoPE op starts the softmax with
the step's own slot, so the tiles go to the tensor cores as loaded; None, each next block is loaded
into registers while the current one is used. Set by decode_attention_bench.py's sweep (`--stages`)."""
TMA: bool = False
"""Where a program loops through Triton's pipeline (LOOP_STAGES), its keys and values are read by
Hopper's tensor memory accelerator into shared memory, one [BLOCK, D] tile per load, instead of
per-thread loads: no registers per element for addresses and masks, so more programs fit an SM and
more tiles are in flight (slots outside the row's range are masked in the softmax, zeroed in the
values). Needs compute capability 9.0, a power-of-two head dim and contiguous caches (`--tma`)."""
BALANCE: bool = False
"""Where a program loops: each chunk takes an even share of its row's valid range (from the row's
first slot to the step's, read after the wait, so no block is loaded before it) instead of a fixed
slice of the cache, which a server's rows (each using part of it, from its own first slot) fill
unevenly. Set by benchmarks/decode_attention_bench.py's sweep (`--balance`)."""


def chunking(batch: int, kv_heads: int, capacity: int, block: int = 64) -> tuple[int, int]:
    """(slots per chunk, chunks) for a cache of `capacity` slots: enough chunks that batch * kv_heads
    * chunks programs fill the GPU (one from ONE_CHUNK_FROM rows x heads), each a whole number of
    `block`-slot blocks."""
    blocks = -(-capacity // block)
    want = 1 if batch * kv_heads >= ONE_CHUNK_FROM else max(1, -(-TARGET_PROGRAMS // (batch * kv_heads)))
    per_chunk = -(-blocks // min(blocks, want)) * block
    return per_chunk, -(-capacity // per_chunk)


def launch_settings(batch: int, kv_heads: int, capacity: int) -> tuple[int, int, int, int]:
    """(block, slots per chunk, chunks, warps). Where the GPU fills with programs of one block each
    (a small batch), the smallest such block (32 or 64 slots) with 2 warps; where a program must
    loop over several blocks (a larger batch), LOOP_BLOCK-slot blocks with 4 warps, pipelined
    through shared memory (LOOP_STAGES); with 2 warps a looping program's tiles spill
    (benchmarks/decode_attention_bench.py --batch 16 sweeps these settings)."""
    if BLOCK_S is not None:
        per_chunk, chunks = chunking(batch, kv_heads, capacity, BLOCK_S)
        return BLOCK_S, per_chunk, chunks, NUM_WARPS or (2 if per_chunk == BLOCK_S else 4)
    for block in (32, 64):
        per_chunk, chunks = chunking(batch, kv_heads, capacity, block)
        if per_chunk == block:
            return block, per_chunk, chunks, NUM_WARPS or 2
    per_chunk, chunks = chunking(batch, kv_heads, capacity, LOOP_BLOCK)
    return LOOP_BLOCK, per_chunk, chunks, NUM_WARPS or 4


@triton.jit
def _rotate(at, d, cos, sin, mask, HALF: tl.constexpr):
    """RoPE (HF's rotate_half) of the head vectors at `at` (pointers to their start, any leading
    shape) over features d, in fp32: x * cos + rotate_half(x) * sin."""
    x = tl.load(at + d, mask=mask, other=0.0).to(tl.float32)
    partner = tl.load(at + tl.where(d < HALF, d + HALF, d - HALF), mask=mask, other=0.0).to(tl.float32)
    return x * cos + tl.where(d < HALF, -partner, partner) * sin


@triton.jit
def _online_block(q, k, v, s_ok, scale, m, total, acc):
    """One block of slots into the running softmax: (max, sum of weights, weighted values)."""
    scores = tl.dot(q, tl.trans(k)) * scale  # [BLOCK_G, BLOCK] in fp32
    scores = tl.where(s_ok[None, :], scores, float("-inf"))
    m_new = tl.maximum(m, tl.max(scores, 1))
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # a block with no valid slot: weights 0, not NaN
    alpha = tl.exp(m - m_ref)
    p = tl.exp(scores - m_ref[:, None])
    total = total * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, total, acc


def _chunk_attention(Q, K, V, Kd, Vd, Start, Pos, Part, Lse, Arrived, Y, InvFreq, slots,
                     stride_qb, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                     stride_pb, stride_ph, stride_pc, stride_lb, stride_lh, stride_yb, stride_yh,
                     scale, window, kv_heads,
                     G: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
                     CHUNK: tl.constexpr, CHUNKS: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK: tl.constexpr,
                     HAS_START: tl.constexpr, ROPE: tl.constexpr, PDL: tl.constexpr, STAGES: tl.constexpr,
                     BALANCE: tl.constexpr, TMA: tl.constexpr):
    row_head = tl.program_id(0)
    chunk = tl.program_id(1)
    b = row_head // kv_heads
    kv = row_head % kv_heads
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    ITERS: tl.constexpr = CHUNK // BLOCK
    # The chunk's first block of keys and values, masked by the cache's size only: slots before the
    # step's were written by this layer's kernel in earlier steps and the step's own is replaced
    # below, so they are read before waiting for the previous kernel (one memory round trip less
    # after it; slots outside the row's valid range are masked out of the softmax).
    s = chunk * CHUNK + tl.arange(0, BLOCK)
    kv_ok = (s < slots)[:, None] & (d < D)[None, :] & (STAGES == 0) & (BALANCE == 0)  # those load their own
    k = tl.load(K + b * stride_kb + s[:, None] * stride_ks + kv * stride_kh + d[None, :], mask=kv_ok, other=0.0)
    v = tl.load(V + b * stride_vb + s[:, None] * stride_vs + kv * stride_vh + d[None, :], mask=kv_ok, other=0.0)
    # The position, the padding and the RoPE frequencies too: no kernel of a step writes them (the
    # position advances in its last kernel, the padding at prefill).
    end = tl.load(Pos) + 1  # one past the step's own slot
    start = end * 0  # the row's first real slot (its left padding), in the slot's integer type
    if HAS_START:
        start = tl.load(Start + b).to(end.dtype)
    if ROPE:  # the angles as kiln.llm.rope.Rotary: position (after padding) x frequency, fp32, rounded
        angle = tl.maximum(end - 1 - start, 0).to(tl.float32) * tl.load(InvFreq + d % (D // 2), mask=d < D, other=0.0)
        cos = tl.cos(angle).to(Q.dtype.element_ty).to(tl.float32)
        sin = tl.sin(angle).to(Q.dtype.element_ty).to(tl.float32)
    if PDL:  # programmatic dependent launch: the next kernel may be scheduled as these programs end;
        gdc_launch_dependents()  # everything below reads what the previous kernel wrote, so wait first
        gdc_wait()
    first = start
    if window > 0:
        first = tl.maximum(first, end - window)
    lo = tl.maximum(chunk * CHUNK, first)
    hi = tl.minimum(chunk * CHUNK + CHUNK, end)
    if BALANCE:  # this chunk's even share of the row's valid range [first, end), in whole blocks
        share = tl.cdiv(tl.cdiv(end - first, CHUNKS), BLOCK) * BLOCK
        lo = first + chunk * share
        hi = tl.minimum(lo + share, end)
    heads = kv * G + g
    gd_ok = (g < G)[:, None] & (d < D)[None, :]
    if ROPE:  # Q is the projection's output [B, (H + 2 Hkv) D]: rotate q and this head's new key here
        row = Q + b * stride_qb
        q = _rotate(row + heads[:, None] * stride_qh, d[None, :], cos[None, :], sin[None, :], gd_ok,
                    D // 2).to(Q.dtype.element_ty)
        k_new = _rotate(row + (kv_heads * G + kv) * stride_qh, d, cos, sin, d < D, D // 2).to(K.dtype.element_ty)
        v_new = tl.load(row + (kv_heads * G + kv_heads + kv) * stride_qh + d, mask=d < D, other=0.0)
        step = end - 1
        if BALANCE:
            writes = (step >= lo) & (step < hi)
        else:
            writes = (step >= chunk * CHUNK) & (step < chunk * CHUNK + CHUNK)
        if writes:  # the chunk holding the step's slot writes it
            tl.store(K + b * stride_kb + step * stride_ks + kv * stride_kh + d, k_new, mask=d < D)
            tl.store(V + b * stride_vb + step * stride_vs + kv * stride_vh + d, v_new.to(V.dtype.element_ty),
                     mask=d < D)
    else:
        q = tl.load(Q + b * stride_qb + heads[:, None] * stride_qh + d[None, :], mask=gd_ok, other=0.0)
    m = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    total = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    # The chunk's blocks that hold slots of the row's valid range [lo, hi): a looping program walks
    # those only (a server's rows use part of its cache, a row's end or padding leaves blocks empty).
    base = chunk * CHUNK
    b_first = tl.maximum(lo - base, 0) // BLOCK
    b_end = tl.where(hi > lo, tl.minimum(tl.maximum(hi - base, 0) + BLOCK - 1, CHUNK) // BLOCK, b_first)
    if BALANCE:  # the share's blocks from its first slot on, nothing loaded before the wait
        base = lo
        b_first = lo * 0
        b_end = tl.where(hi > lo, tl.cdiv(hi - lo, BLOCK), 0)
    if ITERS == 1 and not BALANCE:  # one block per program (a small batch): the block loaded before the wait
        s_ok = (s >= lo) & (s < hi)
        if ROPE:
            here = (s == end - 1)[:, None]
            k = tl.where(here, k_new[None, :], k)
            v = tl.where(here, v_new[None, :].to(v.dtype), v)
        m, total, acc = _online_block(q, k, v, s_ok, scale, m, total, acc)
    elif STAGES > 0:  # Triton's pipeline: the block loaded before the wait is not used, each is loaded in the loop
        skip = end * 0 - 1  # a slot the loop leaves out: none
        if ROPE:  # the step's own slot starts the softmax, from the new key and value (as a block of one slot),
            # so the loop's tiles go from shared memory to the tensor cores unchanged; the loop leaves it out
            skip = end - 1
            own = writes
            m = tl.where(own, tl.sum(q.to(tl.float32) * k_new.to(tl.float32)[None, :], 1) * scale, m)
            total = tl.where(own, 1.0, total)
            acc = tl.where(own, acc + v_new.to(V.dtype.element_ty).to(tl.float32)[None, :], acc)
        for i in tl.range(b_first, b_end, num_stages=STAGES):
            at = base + i * BLOCK  # (`s` before the loop has the chunk's integer type, this the bounds')
            sl = at + tl.arange(0, BLOCK)
            s_ok = (sl >= lo) & (sl < hi) & (sl != skip)
            if TMA:  # Kd, Vd: descriptors of the caches as [B * S, Hkv * D]; a tile past a row's end is masked
                first_row = (b * slots + at).to(tl.int32)  # TMA's coordinates are 32-bit
                k = Kd.load([first_row, kv * D])
                v = tl.where(s_ok[:, None], Vd.load([first_row, kv * D]), 0.0)
            else:
                ok = s_ok[:, None] & (d < D)[None, :]
                k = tl.load(K + b * stride_kb + sl[:, None] * stride_ks + kv * stride_kh + d[None, :], mask=ok,
                            other=0.0)
                v = tl.load(V + b * stride_vb + sl[:, None] * stride_vs + kv * stride_vh + d[None, :], mask=ok,
                            other=0.0)
            m, total, acc = _online_block(q, k, v, s_ok, scale, m, total, acc)
    else:
        # The first block to walk: the one loaded before the wait, or (padding or a window before it)
        # a later one, loaded now. Its values outside [lo, hi) are zeroed: they weigh 0 in the softmax,
        # but 0 x NaN is NaN (a key's NaN score is masked to -inf, so keys need no zeroing).
        if BALANCE:
            moved = b_first == 0  # nothing was loaded before the wait: load the first block
        else:
            moved = b_first > 0
        s = base + b_first * BLOCK + tl.arange(0, BLOCK)
        ok = ((s >= lo) & (s < hi))[:, None] & (d < D)[None, :]
        k_at = tl.load(K + b * stride_kb + s[:, None] * stride_ks + kv * stride_kh + d[None, :], mask=ok & moved,
                       other=0.0)
        v_at = tl.load(V + b * stride_vb + s[:, None] * stride_vs + kv * stride_vh + d[None, :], mask=ok & moved,
                       other=0.0)
        k = tl.where(moved, k_at, k)
        v = tl.where(ok, tl.where(moved, v_at, v), 0.0)
        for i in range(b_first, b_end):
            s_ok = (s >= lo) & (s < hi)
            # The next block's keys and values are loaded before this one is used, and only its slots in
            # the row's valid range [lo, hi): a looping program (a larger batch, or a cache with more
            # slots than the rows use, as a server's) reads no slot it would mask out of the softmax.
            s_next = s + BLOCK
            next_ok = ((s_next < slots) & (s_next >= lo) & (s_next < hi))[:, None] & (d < D)[None, :] & (i + 1 < b_end)
            k_next = tl.load(K + b * stride_kb + s_next[:, None] * stride_ks + kv * stride_kh + d[None, :], mask=next_ok,
                             other=0.0)
            v_next = tl.load(V + b * stride_vb + s_next[:, None] * stride_vs + kv * stride_vh + d[None, :], mask=next_ok,
                             other=0.0)
            if ROPE:  # the step's own slot: the new key and value (its write above may not be visible yet)
                here = (s == end - 1)[:, None]
                k = tl.where(here, k_new[None, :], k)
                v = tl.where(here, v_new[None, :].to(v.dtype), v)
            m, total, acc = _online_block(q, k, v, s_ok, scale, m, total, acc)
            s, k, v = s_next, k_next, v_next
    has = total > 0
    part = tl.where(has[:, None], acc / tl.where(has, total, 1.0)[:, None], 0.0)
    if CHUNKS == 1:  # the row and head's only chunk: its result is the output (what the combine would write)
        tl.store(Y + b * stride_yb + heads[:, None] * stride_yh + d[None, :], part.to(Y.dtype.element_ty), mask=gd_ok)
    else:
        lse = tl.where(has, m + tl.log(tl.where(has, total, 1.0)), float("-inf"))
        part_at = Part + b * stride_pb + heads[:, None] * stride_ph + d[None, :]
        lse_at = Lse + b * stride_lb + heads * stride_lh
        tl.store(part_at + chunk * stride_pc, part, mask=gd_ok)
        tl.store(lse_at + chunk, lse, mask=g < G)
        # The last chunk of this (row, key/value head) to finish combines all of them, each weighted by
        # its share of the softmax mass (empty chunks weigh 0). acq_rel: the other chunks' stores are
        # visible once their arrival is counted; one thread does the atomic, so a barrier comes first.
        tl.debug_barrier()
        arrived = tl.atomic_add(Arrived + row_head, 1, sem="acq_rel")
        if arrived == CHUNKS - 1:
            # One [chunks, D] tile per head, loaded at once (a loop over chunks would serialise ~40
            # dependent loads); the next head's before this one's store, which they might alias.
            c = tl.arange(0, BLOCK_C)
            c_ok = c < CHUNKS
            pc_ok = c_ok[:, None] & (d < D)[None, :]
            lse_of = Lse + b * stride_lb + kv * G * stride_lh + c
            part_of = Part + b * stride_pb + kv * G * stride_ph + c[:, None] * stride_pc + d[None, :]
            lses = tl.load(lse_of, mask=c_ok, other=float("-inf"))
            parts = tl.load(part_of, mask=pc_ok, other=0.0)
            for gi in tl.static_range(G):
                if gi + 1 < G:
                    lses_next = tl.load(lse_of + (gi + 1) * stride_lh, mask=c_ok, other=float("-inf"))
                    parts_next = tl.load(part_of + (gi + 1) * stride_ph, mask=pc_ok, other=0.0)
                w = tl.exp(lses - tl.max(lses, 0))  # the chunk holding the step's own slot is never empty
                y = tl.sum(parts * w[:, None], 0) / tl.sum(w, 0)
                tl.store(Y + b * stride_yb + (kv * G + gi) * stride_yh + d, y.to(Y.dtype.element_ty), mask=d < D)
                if gi + 1 < G:
                    lses = lses_next
                    parts = parts_next
            tl.atomic_xchg(Arrived + row_head, 0)  # every chunk has arrived: reset for the next call


_KERNELS: dict[bool, object] = {}


def _kernel():
    """The jitted kernel; Triton picks its interpreter at jit time from TRITON_INTERPRET, so tests
    that set it get an interpreted copy."""
    interpret = interpreting()
    if interpret not in _KERNELS:
        _KERNELS[interpret] = triton.jit(_chunk_attention)
    return _KERNELS[interpret]


def _tma_runs(cache_k: Tensor, cache_v: Tensor) -> bool:
    """TMA is asked for and can read these caches: Hopper or newer (or the interpreter), contiguous
    caches with a power-of-two head dim."""
    D = cache_k.shape[-1]
    if not TMA or D & (D - 1) or not (cache_k.is_contiguous() and cache_v.is_contiguous()):
        return False
    return interpreting() or (cache_k.is_cuda and torch.cuda.get_device_capability(cache_k.device)[0] >= 9)


def _descriptor(cache: Tensor, block: int):
    """A TMA descriptor of a cache [B, S, Hkv, D] seen as [B * S, Hkv * D], read in [block, D] tiles."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    B, S, Hkv, D = cache.shape
    return TensorDescriptor.from_tensor(cache.view(B * S, Hkv * D), [block, D])


def early_launch(rope: bool, chunks: int) -> bool:
    """Whether a call is launched with programmatic dependent launch (where the GPU has it): the fused
    op only, whose predecessor is kiln's PDL-aware projection, and one chunk per row and head only
    with PDL_ONE_CHUNK."""
    return rope and (chunks > 1 or PDL_ONE_CHUNK)


def _launch(q: Tensor | None, qkv_rows: Tensor | None, inv_freq: Tensor | None, cache_k: Tensor, cache_v: Tensor,
            start: Tensor | None, pos: Tensor, scale: float, window: int, heads: int = 0) -> Tensor:
    """Runs the kernel on q [B, H, D], or on the projection's output `qkv_rows` [B, (heads + 2 Hkv) D]
    with the RoPE frequencies `inv_freq` [D / 2] (fp32) to rotate it and write the cache (q None).
    `start` None: no row is padded."""
    cache_k, cache_v = (t if t.stride(-1) == 1 else t.contiguous() for t in (cache_k, cache_v))
    S, Hkv, D = cache_k.shape[1], cache_k.shape[2], cache_k.shape[3]
    B, H = (qkv_rows.shape[0], heads) if q is None else q.shape[:2]
    ref = qkv_rows if q is None else q
    block, per_chunk, chunks, warps = launch_settings(B, Hkv, S)
    y = torch.empty(B, H, D, dtype=ref.dtype, device=ref.device)
    # One chunk per row and head writes y itself: no partial results, no arrivals to count.
    part = torch.empty(B, H, chunks, D, dtype=torch.float32, device=ref.device) if chunks > 1 else y.new_empty(1, 1, 1, dtype=torch.float32)
    lse = torch.empty(B, H, chunks, dtype=torch.float32, device=ref.device) if chunks > 1 else part
    arrived = arrival_counters(ref.device, B * Hkv) if chunks > 1 else part
    group = H // Hkv
    rope = qkv_rows is not None
    src, stride_b, stride_h = (qkv_rows, qkv_rows.stride(0), D) if rope else (q, q.stride(0), q.stride(1))
    pdl = early_launch(rope, chunks) and pdl_enabled(ref.device)
    stages = LOOP_STAGES if per_chunk > block and LOOP_STAGES else 0
    tma = stages > 0 and _tma_runs(cache_k, cache_v)
    k_desc, v_desc = (_descriptor(c, block) for c in (cache_k, cache_v)) if tma else (cache_k, cache_v)
    _kernel()[(B * Hkv, chunks)](
        src, cache_k, cache_v, k_desc, v_desc, pos if start is None else start, pos, part, lse,
        arrived, y, inv_freq if rope else src, S,
        stride_b, stride_h, cache_k.stride(0), cache_k.stride(1), cache_k.stride(2),
        cache_v.stride(0), cache_v.stride(1), cache_v.stride(2),
        part.stride(0), part.stride(1), part.stride(2), lse.stride(0), lse.stride(1), y.stride(0), y.stride(1),
        scale, window, Hkv,
        G=group, BLOCK_G=max(16, triton.next_power_of_2(group)), D=D, BLOCK_D=triton.next_power_of_2(D),
        CHUNK=per_chunk, CHUNKS=chunks, BLOCK_C=triton.next_power_of_2(chunks), BLOCK=block, HAS_START=start is not None,
        ROPE=rope, PDL=pdl, STAGES=stages, BALANCE=BALANCE and per_chunk > block, TMA=tma, num_warps=warps,
        num_stages=2, **({"launch_pdl": True} if pdl else {}))
    return y


@torch.library.custom_op("kiln::decode_attention", mutates_args=())
def decode_attention(q: Tensor, cache_k: Tensor, cache_v: Tensor, start: Tensor | None, pos: Tensor, scale: float,
                     window: int) -> Tensor:
    """Attention of one decode step. q [B, H, D]; cache_k/v [B, S, Hkv, D] with this step's
    key/value written; start [B]: each row's first real slot (None: 0); pos [1]: the step's slot; window:
    attend to the last `window` slots only (0: all). Returns [B, H, D] in q's dtype."""
    q = q if q.stride(-1) == 1 else q.contiguous()
    return _launch(q, None, None, cache_k, cache_v, start, pos, scale, window)


@decode_attention.register_fake
def _(q, cache_k, cache_v, start, pos, scale, window):
    return torch.empty_like(q)


@torch.library.custom_op("kiln::decode_attention_rope", mutates_args=("cache_k", "cache_v"))
def decode_attention_rope(qkv: Tensor, inv_freq: Tensor, cache_k: Tensor, cache_v: Tensor, pad: Tensor | None,
                          pos: Tensor, scale: float, window: int, heads: int) -> Tensor:
    """`decode_attention` from the q/k/v projection's output qkv [B, (heads + 2 Hkv) D] (one token
    per row): rotates q and the new key (RoPE, rotate_half, at position pos - pad[b] with the
    frequencies inv_freq [D / 2], fp32, angles computed in the kernel), writes the new key and value
    into slot `pos` of cache_k/v and attends, in one launch (with programmatic dependent launch on
    Hopper as `early_launch` says). `pad` [B]: each row's left padding (None: none). Returns [B,
    heads, D] in qkv's dtype. The angles are computed here, not passed: as inputs, inductor gives
    every layer its own copy of cos and sin, one more kernel per layer before the attention."""
    if cache_k.stride(-1) != 1 or cache_v.stride(-1) != 1:
        raise ValueError("decode_attention_rope writes the caches in place: their last dim must be contiguous")
    qkv = qkv if qkv.stride(-1) == 1 else qkv.contiguous()
    return _launch(None, qkv, inv_freq, cache_k, cache_v, pad, pos, scale, window, heads)


@decode_attention_rope.register_fake
def _(qkv, inv_freq, cache_k, cache_v, pad, pos, scale, window, heads):
    return qkv.new_empty(qkv.shape[0], heads, cache_k.shape[-1])
