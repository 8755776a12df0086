"""torchtitan as a peer of `kiln bench train-llm`: its job and run (job.py), the launcher its
process runs (torchtitan_llama.py, a script started by path), the peer's steps (peer.py)."""
