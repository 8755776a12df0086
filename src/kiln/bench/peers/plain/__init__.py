"""The training loop a user writes by hand around transformers, as a peer row of
`kiln bench train-llm`: the loop (loop.py) and the peer's steps (peer.py)."""
