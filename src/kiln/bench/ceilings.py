"""Hardware ceilings: measured on the spot, and the datasheet's figures for the GPU by name.

Datasheet peaks are not what a kernel can reach on this machine today (clocks, ECC, power caps,
another tenant), and one benchmark kernel is not the hardware's limit either, so figures are
reported against both (kiln.bench.gpu_specs for the datasheet). The measured ceilings:
- read bandwidth: the fastest of a few read-only streaming kernels (a reduction reads every byte
  once and writes almost nothing) over a buffer far larger than the L2 cache; that is the work a
  decode step does (it reads the weights). A device-to-device copy, which also writes, is kept
  beside it (`copy_bytes_per_s`, bytes read + written) for comparison with older results;
- matmul: the best of several square matmul sizes in the benchmark's dtype, 2·n³ FLOPs per call
  (one size can sit below the peak from tiling or wave quantization).
All go through the shared timing helper (warm-up, synchronize, median).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from kiln.bench.formulas import decode_bytes_per_s, matmul_flops, ratio
from kiln.bench.gpu_specs import lookup, spec_dtype, table_flops
from kiln.timing import measure


@dataclass(frozen=True)
class Ceilings:
    copy_bytes_per_s: float
    """Bytes read + written per second by a device-to-device copy."""
    matmul_flops_per_s: float
    """FLOP/s of the best square matmul in `dtype` (sizes in `matmul_sizes`)."""
    copy_bytes: int
    """Size of the copied (and streamed) buffer."""
    matmul_n: int
    """The matmul size that was fastest."""
    dtype: str
    device: str
    read_bytes_per_s: float | None = None
    """Bytes/s of the fastest read-only streaming kernel (`read_kernel`)."""
    read_kernel: str | None = None
    read_by_kernel: dict[str, float] = field(default_factory=dict)
    """Bytes/s of each read-only kernel tried."""
    matmul_by_n: dict[int, float] = field(default_factory=dict)
    """FLOP/s of each matmul size tried."""
    gpu_name: str | None = None
    spec_name: str | None = None
    """The datasheet entry the GPU name matched (None: not in kiln.bench.gpu_specs)."""
    spec_source: str | None = None
    spec_bytes_per_s: float | None = None
    spec_flops_per_s: float | None = None
    """Datasheet dense peak at `dtype` (TF32 for float32 when `tf32`)."""

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def bandwidth(self) -> float:
        """The measured bandwidth ceiling: the read-only stream where measured, else the copy."""
        return self.read_bytes_per_s or self.copy_bytes_per_s


def _default_sizes(device: torch.device) -> tuple[int, tuple[int, ...]]:
    # GPU: 1 GiB (far beyond any L2) and matmuls up to 16384³ (tensor cores saturated, several
    # tilings). CPU: small enough for a test to measure in well under a second.
    return (1 << 30, (4096, 8192, 12288, 16384)) if device.type == "cuda" else (64 << 20, (256, 512))


def measure_copy_bandwidth(device: torch.device | str, nbytes: int | None = None, repeats: int = 20) -> float:
    """Bytes/s (read + written) of a device-to-device copy of `nbytes`."""
    dev = torch.device(device)
    nbytes = nbytes or _default_sizes(dev)[0]
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev).fill_(1)
    dst = torch.empty_like(src)
    timing = measure(lambda: dst.copy_(src), warmup=3, repeats=repeats, device=dev)
    return 2 * nbytes / timing.median_s


def _read_kernels(buf: torch.Tensor) -> dict[str, Callable[[], object]]:
    """Read-only kernels over `buf` (bytes): each reads all of it once and writes a scalar or a few."""
    f32 = buf.view(torch.float32)
    i64 = buf.view(torch.int64)
    kernels: dict[str, Callable[[], object]] = {
        "sum_fp32": lambda: f32.sum(),
        "amax_int64": lambda: i64.amax(),
    }
    if buf.is_cuda:
        from kiln.kernels.stream_read import triton_read

        for block, warps in ((4096, 8), (16384, 16)):  # 32 and 128 KiB per program
            reader = triton_read(buf, block, warps)
            if reader is not None:
                kernels[f"triton_stream_{block * 8 // 1024}k"] = reader
    return kernels


def measure_read_bandwidth(device: torch.device | str, nbytes: int | None = None,
                           repeats: int = 20) -> tuple[float, str, dict[str, float]]:
    """(bytes/s of the fastest read-only kernel, its name, bytes/s of each) over `nbytes`."""
    dev = torch.device(device)
    nbytes = nbytes or _default_sizes(dev)[0]
    nbytes -= nbytes % 64
    buf = torch.empty(nbytes, dtype=torch.uint8, device=dev).fill_(1)
    rates: dict[str, float] = {}
    for name, fn in _read_kernels(buf).items():
        try:
            rates[name] = nbytes / measure(fn, warmup=3, repeats=repeats, device=dev).median_s
        except Exception:  # a kernel this torch/triton cannot run: the others still bound the device
            continue
    best = max(rates, key=rates.__getitem__)
    return rates[best], best, rates


def measure_matmul_flops(device: torch.device | str, dtype: torch.dtype = torch.bfloat16, n: int | None = None,
                         repeats: int = 20) -> float:
    """FLOP/s of an n³ matmul in `dtype` (n: the largest default size)."""
    dev = torch.device(device)
    n = n or _default_sizes(dev)[1][-1]
    a = torch.randn(n, n, device=dev).to(dtype)
    b = torch.randn(n, n, device=dev).to(dtype)
    out = torch.empty(n, n, device=dev, dtype=a.dtype)
    timing = measure(lambda: torch.mm(a, b, out=out), warmup=3, repeats=repeats, device=dev)
    return matmul_flops(n, n, n) / timing.median_s


def measure_best_matmul(device: torch.device | str, dtype: torch.dtype = torch.bfloat16,
                        sizes: tuple[int, ...] | None = None, repeats: int = 10) -> tuple[float, int, dict[int, float]]:
    """(best FLOP/s, its n, FLOP/s per n) over square matmuls of `sizes`."""
    dev = torch.device(device)
    sizes = sizes or _default_sizes(dev)[1]
    rates = {n: measure_matmul_flops(dev, dtype, n, repeats) for n in sizes}
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    best = max(rates, key=rates.__getitem__)
    return rates[best], best, rates


def spec_figures(device: torch.device, dtype: torch.dtype, tf32: bool = True) -> dict:
    """The datasheet fields of `Ceilings` for this device (all None off CUDA or for an unknown GPU)."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    spec = lookup(name)
    if spec is None:  # no bandwidth entry: the FLOP table (the one MFU uses) may still know the part
        flops = table_flops(name, spec_dtype(str(dtype), tf32)) if name else None
        return {"gpu_name": name, "spec_flops_per_s": flops,
                **({"spec_source": "kiln.monitor.flops peak table"} if flops else {})}
    return {"gpu_name": name, "spec_name": spec.name, "spec_source": spec.source, "spec_bytes_per_s": spec.bytes_per_s,
            "spec_flops_per_s": spec.flops_per_s(spec_dtype(str(dtype), tf32))}


def measure_ceilings(device: torch.device | str, dtype: torch.dtype = torch.bfloat16, *, copy_bytes: int | None = None,
                     matmul_n: int | None = None, matmul_sizes: tuple[int, ...] | None = None) -> Ceilings:
    """Copy and read bandwidth, the best matmul (`matmul_n` alone, if given) and the datasheet's figures."""
    dev = torch.device(device)
    default_bytes, _ = _default_sizes(dev)
    copy_bytes = copy_bytes or default_bytes
    bandwidth = measure_copy_bandwidth(dev, copy_bytes)
    read, read_kernel, reads = measure_read_bandwidth(dev, copy_bytes)
    if dev.type == "cuda":
        torch.cuda.empty_cache()  # hand the copy buffers back before the matmuls and the models load
    flops, best_n, by_n = measure_best_matmul(dev, dtype, (matmul_n,) if matmul_n else matmul_sizes)
    return Ceilings(bandwidth, flops, copy_bytes, best_n, str(dtype).removeprefix("torch."), str(dev),
                    read_bytes_per_s=read, read_kernel=read_kernel, read_by_kernel=reads, matmul_by_n=by_n,
                    **spec_figures(dev, dtype, torch.get_float32_matmul_precision() != "highest"))


def bandwidth_fractions(row: dict, c: Ceilings, batch: int, tok_s: float | None = None) -> None:
    """A row's decode bandwidth (bytes per step x steps/s at `tok_s`, default its decode tok/s;
    the bytes per step are `step_bytes` where the row has them, the weights and the KV cache, else
    `weight_bytes`) against the measured read-only stream (`roofline_frac`), the datasheet
    (`roofline_spec_frac`) and a device copy (`roofline_copy_frac`, the denominator older results used)."""
    step_bytes = row.get("step_bytes") or row["weight_bytes"]
    achieved = decode_bytes_per_s(step_bytes, tok_s if tok_s is not None else row.get("decode_tok_s"), batch)
    if achieved is None:
        return
    row.update(achieved_gbs=achieved / 1e9, roofline_frac=ratio(achieved, c.bandwidth),
               roofline_spec_frac=ratio(achieved, c.spec_bytes_per_s),
               roofline_copy_frac=ratio(achieved, c.copy_bytes_per_s))


def matmul_dtype(policy: str, tf32: bool) -> torch.dtype:
    """The matrix-unit precision a precision policy runs its matmuls in (fp32 runs on the TF32
    tensor cores on CUDA when `tf32` is allowed, which the caller's tf32 setting decides)."""
    if policy.startswith("bf16"):
        return torch.bfloat16
    if policy.startswith("fp16"):
        return torch.float16
    return torch.float32
