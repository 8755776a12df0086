"""kiln advise: check a model and config against the speed checklist, with fixes and measured gains."""
