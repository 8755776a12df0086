"""kiln profile: torch.profiler over a window of the training step, trace analysis, memory."""
