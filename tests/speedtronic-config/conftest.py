"""Python's default Ctrl-C handling for the config tests, however the suite was started."""

from __future__ import annotations

import signal

# A suite started as a script's background job (`pytest ... &`) inherits SIGINT ignored, which
# Python keeps: the Ctrl-C tests need Python's default handler.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
