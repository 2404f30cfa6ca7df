"""The regression gate: compare distributions of per-process repeats, config by config."""
