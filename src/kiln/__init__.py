"""kiln: fast PyTorch training and inference, with evidence."""

__version__ = "0.1.0"
