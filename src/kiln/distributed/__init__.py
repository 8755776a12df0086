"""Data parallelism through torch.distributed: process groups, torchrun launch, DDP, FSDP2."""
