"""Fixtures shared by the MetaSchedule plugin's tests."""

from collage_core.kit.testing import backends, pm  # noqa: F401 (the fixtures every plugin's tests share)
