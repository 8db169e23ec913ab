"""Measuring: worker processes that build and time candidates and placements, the timing itself, and the cost database."""
