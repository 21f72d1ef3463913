"""2.0 import path `speedtronic.distributed.outer`: the objects of `speedtronic_diloco.outer` (the
same objects, not copies).
"""

from speedtronic_diloco.outer import *  # noqa: F403
from speedtronic_diloco.outer import __all__  # noqa: F401
