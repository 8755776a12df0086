"""train_llm: see docs/architecture.md."""
