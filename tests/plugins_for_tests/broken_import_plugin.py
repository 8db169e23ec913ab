"""A plugin whose import fails, as one with a missing native library would."""

raise ImportError("libbroken.so not found: apt-get install libbroken")
