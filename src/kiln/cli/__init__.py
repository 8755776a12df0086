"""Command-line interface: argument parsing only; the work happens in the library."""
