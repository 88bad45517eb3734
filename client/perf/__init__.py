"""Performance harness."""
