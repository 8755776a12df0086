"""CPU runs: topology, intra-op threads, core/NUMA pinning."""
