"""Sweep orchestration: one fresh worker process per config repeat."""
