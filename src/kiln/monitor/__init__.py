"""Run metrics: FLOPs and MFU, memory, step-time statistics, sinks (console, JSONL, TensorBoard), environment."""
