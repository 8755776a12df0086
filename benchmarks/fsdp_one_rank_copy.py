"""Host time of FSDP2's one-rank unshard: torch's copy per parameter against kiln's fused copy.

    python benchmarks/fsdp_one_rank_copy.py [--device cuda] [--embed-dim 768] [--out DIR]

One process, one rank (gloo on CPU, NCCL with `--device cuda`). kiln's ViT (12 blocks, 152
parameters) is sharded as one FSDP2 unit twice, once left to torch and once with
kiln.distributed.fsdp_one_rank installed; each sample times `calls` rounds of what a unit does every
step it is gathered: `unshard()`, `wait_for_unshard()` (the part the fused copy replaces) and the
reshard, the two models interleaved (kiln.timing), for the param dtype of the fp32 and the
bf16-mixed policies. The default widths are tiny, so the figure is the host's; `--embed-dim 768`
gives ViT-B/16's parameters. The full training step with and without it:
benchmarks/fsdp_host_overhead.py (variants `*-torch-copy`).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

import torch
import torch.distributed as dist

from kiln.bench.results import write_results
from kiln.distributed.fsdp_one_rank import fsdp_param_groups, install_one_rank_unshard
from kiln.models.vit import build_vit
from kiln.monitor.env import collect_env
from kiln.timing import measure_interleaved


def _unit(fused: bool, param_dtype: torch.dtype | None, embed_dim: int, device: torch.device):
    """The model's only FSDP2 param group, lazily initialised by one forward and backward."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    torch.manual_seed(0)
    model = build_vit(img_size=32, patch_size=8, embed_dim=embed_dim, depth=12, num_heads=2, num_classes=10)
    fully_shard(model.to(device), mp_policy=MixedPrecisionPolicy(param_dtype=param_dtype))
    if fused and install_one_rank_unshard(model) != 1:
        raise SystemExit("kiln's fused copy did not install here (see the log line above)")
    model(torch.randn(2, 3, 32, 32, device=device)).float().sum().backward()
    (group,) = fsdp_param_groups(model)
    return group


def _cycle(group):
    def run() -> None:
        group.unshard()
        group.wait_for_unshard()
        group._to_sharded()

    return run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--embed-dim", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--calls", type=int, default=20, help="unshard rounds per timed sample")
    ap.add_argument("--out", default=None, help="write DIR/results.json and results.md")
    args = ap.parse_args(argv)
    device = torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cpu":
        torch.set_num_threads(1)
    else:
        torch.cuda.set_device(device)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29519")
    dist.init_process_group("gloo" if device.type == "cpu" else "nccl", rank=0, world_size=1)
    rows = []
    for label, param_dtype in (("fp32", None), ("bf16", torch.bfloat16)):
        groups = {"torch": _unit(False, param_dtype, args.embed_dim, device),
                  "kiln": _unit(True, param_dtype, args.embed_dim, device)}
        times = measure_interleaved({name: _cycle(g) for name, g in groups.items()}, warmup=5, repeats=args.repeats,
                                    calls_per_sample=args.calls, device=device)
        for name, t in times.items():
            ms = t.as_dict(per=args.calls)
            rows.append({"status": "ok", "param_dtype": label, "copy": name, "parameters": len(groups[name].fsdp_params),
                         "ms": ms["median_ms"], "ms_p10": ms["p10_ms"], "ms_p90": ms["p90_ms"]})
            print(f"param dtype {label:5s} {name:6s} {ms['median_ms']:7.3f} ms per unshard + wait + reshard "
                  f"(p10 {ms['p10_ms']:.3f}, p90 {ms['p90_ms']:.3f})")
    dist.destroy_process_group()
    if args.out:
        columns = ["param_dtype", "copy", "parameters", "ms", "ms_p10", "ms_p90", "status"]
        write_results(args.out, env=collect_env(), config=vars(args), results=rows, columns=columns,
                      title=f"FSDP2 one-rank unshard, one unit of kiln's ViT ({device.type}, embed {args.embed_dim})",
                      command="python " + shlex.join(sys.argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
