"""PyTorch backend (imports torch lazily)."""
