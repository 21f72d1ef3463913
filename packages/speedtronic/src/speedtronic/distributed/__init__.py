"""2.0 import path `speedtronic.distributed`: the objects of `speedtronic_diloco` (the same objects,
not copies).
"""

from speedtronic_diloco import *  # noqa: F403
from speedtronic_diloco import __all__  # noqa: F401
