"""Results: the versioned schema, the run directory, loading."""
