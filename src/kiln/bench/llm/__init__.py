"""llm: see docs/architecture.md."""
