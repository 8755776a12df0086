"""`kiln generate`'s library: its options (and the LLM options `kiln bench llm` shares), the check
that turns them into a request, and the generation itself; kiln.cli.generate_cmd only parses and
prints."""
