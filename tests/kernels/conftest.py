"""Fixtures the kernel tests share with the decoder's tests (tiny checkpoints of each family)."""

from ..llm.conftest import checkpoints  # noqa: F401  (a session fixture: the kernels run inside real decoders)
