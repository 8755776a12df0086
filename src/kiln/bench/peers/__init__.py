"""Other projects' trainers and engines run beside kiln's as rows of `kiln bench llm` and
`kiln bench train-llm`: one folder per peer (its launcher or child script shipped inside it), each
implementing the interface of base.py and listed in registry.py. A peer from another project runs
from its own checkout or installation, in its own process, its version recorded; kiln only converts
the model for it, starts it and reads its output."""
