"""``gpubench profile``: operator profiles, traces and the where-time-goes breakdown."""
