"""kiln autotune: measure candidate recipes within a time budget and write the best config."""
