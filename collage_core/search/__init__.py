"""Searching: the op-level placement from measured costs, its calibration, and the two-level search over graph-level backends."""
