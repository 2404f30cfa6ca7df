"""Timing, the measurement loop and statistics, written once for every framework."""
