"""A plugin whose import takes ``$SLOW_IMPORT_S`` seconds (default 0), for testing a worker kept busy
(here, loading its plugins) when its run goes away; registers no backend, never installed."""

import os
import time

time.sleep(float(os.environ.get("SLOW_IMPORT_S", "0")))
