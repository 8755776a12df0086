"""`kiln serve`: an exported model behind an OpenAI-compatible HTTP endpoint, with continuous
batching. kiln.serve.rows holds the KV-cache rows requests join and leave, kiln.serve.scheduler the
loop that admits, prefills and decodes, kiln.serve.app the HTTP routes; kiln.cli.serve_cmd only
parses and calls kiln.serve.server.run_serve."""
