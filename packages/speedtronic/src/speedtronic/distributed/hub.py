"""2.0 import path `speedtronic.distributed.hub`: the objects of `speedtronic_diloco.hub` (the same
objects, not copies).
"""

from speedtronic_diloco.hub import *  # noqa: F403
from speedtronic_diloco.hub import __all__  # noqa: F401
