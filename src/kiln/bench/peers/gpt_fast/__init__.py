"""gpt-fast as a peer of `kiln bench llm`: the model converted to its checkpoint and its processes
(process.py), the child script they run (child.py), the peer's steps (peer.py)."""
