"""Benchmarks: the shared timing core and result files; `kiln bench` commands build on these."""
