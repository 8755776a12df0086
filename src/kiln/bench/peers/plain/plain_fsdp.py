"""The FSDP2 training loop a user writes by hand around transformers, one process per rank, as the
plain row of `kiln bench train-llm --nproc-per-node N` (kiln.bench.peers.plain.plain_fsdp_row
starts it by its path under torchrun; it imports torch, numpy and transformers only, never kiln):

    model = LlamaForCausalLM.from_pretrained(dir)                      # fp32, on the host
    model.gradient_checkpointing_enable()                              # only with "ac": "full"
    mp = MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)
    for layer in model.model.layers:
        layer.compile(); fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)                        # moves the shards to the GPU
    opt = AdamW(model.parameters(), fused=True); warm-up then constant learning rate
    for x, y in loader:                                                # DistributedSampler, no shuffle
        loss = cross_entropy(model(input_ids=x).logits.float(), y)
        loss.backward(); clip_grad_norm_(model.parameters(), 1.0); opt.step(); opt.zero_grad()

    python -m torch.distributed.run --standalone --nproc-per-node N plain_fsdp.py --job JOB.json

JOB.json: weights_dir, inputs, labels (.npy [samples, seq] int64), steps, batch (per rank), lr,
betas, eps, weight_decay, warmup_steps, max_norm, mixed ("bf16" or "fp32"), compile, ac
("none" or "full"), metrics (the JSON-lines file rank 0 writes: per step the loss averaged over
ranks and the step's seconds, host-synchronised each step as a loop that prints its loss is),
info (a JSON file: parameters, peak memory of the fullest rank, versions).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main(argv: list[str]) -> None:
    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    import transformers
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--job", required=True)
    job = json.loads(open(p.parse_args(argv).job, encoding="utf-8").read())
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cuda = torch.cuda.is_available() and job.get("device", "cuda") == "cuda"
    if cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo")
    mesh = init_device_mesh(device.type, (world,))

    model = transformers.AutoModelForCausalLM.from_pretrained(job["weights_dir"], dtype=torch.float32,
                                                              attn_implementation="sdpa", local_files_only=True)
    model.config.use_cache = False
    model.train()
    if job["ac"] == "full":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    params = sum(t.numel() for t in model.parameters())
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if job["mixed"] == "bf16" \
        else MixedPrecisionPolicy()
    for layer in model.model.layers:
        if job["compile"]:
            layer.compile()
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=job["lr"], betas=tuple(job["betas"]), eps=job["eps"],
                            weight_decay=job["weight_decay"], fused=cuda)
    warmup = job["warmup_steps"]
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: (s + 1) / warmup if s < warmup else 1.0)

    data = TensorDataset(torch.from_numpy(np.load(job["inputs"])), torch.from_numpy(np.load(job["labels"])))
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=False, drop_last=True)
    loader = DataLoader(data, batch_size=job["batch"], sampler=sampler, drop_last=True)
    records = []
    for step, (x, y) in zip(range(job["steps"]), loader, strict=False):
        start = time.perf_counter()
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        logits = model(input_ids=x).logits
        loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), job["max_norm"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)  # SUM (gloo has no AVG): the mean of equal local batches
        value = float(mean.item()) / world
        records.append({"step": step + 1, "loss": value, "step_s": time.perf_counter() - start})
    peak = torch.tensor([float(torch.cuda.max_memory_allocated(device)) if cuda else 0.0], device=device)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    if rank == 0:
        with open(job["metrics"], "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
        info = {"params": params, "peak_mem_bytes_max_rank": int(peak.item()) if cuda else None, "world": world,
                "torch": torch.__version__, "transformers": transformers.__version__}
        with open(job["info"], "w", encoding="utf-8") as f:
            json.dump(info, f, indent=1)
    # Every rank tears gloo down together: a rank that destroyed its group while rank 0 was still
    # writing aborted one CPU run of two ranks in about twenty-five ("terminate called without an
    # active exception", SIGABRT) after its steps were done.
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    # Started by its path: keep kiln's modules beside this script off the import path.
    if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
        sys.path.pop(0)
    main(sys.argv[1:])
