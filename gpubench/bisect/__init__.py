"""``gpubench bisect``: from a flagged slowdown to the commit that caused it."""
