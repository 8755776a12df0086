"""compile: see docs/architecture.md."""
