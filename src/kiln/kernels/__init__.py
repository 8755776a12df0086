"""kernels: see docs/architecture.md."""
