"""kiln report: markdown and self-contained HTML reports with plots of runs and bench results."""
