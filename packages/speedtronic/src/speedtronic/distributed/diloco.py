"""2.0 import path `speedtronic.distributed.diloco`: the objects of `speedtronic_diloco.diloco` (the
same objects, not copies).
"""

from speedtronic_diloco.diloco import *  # noqa: F403
from speedtronic_diloco.diloco import __all__  # noqa: F401
