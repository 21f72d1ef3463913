"""2.0 import path `speedtronic.config`: the objects of `speedtronic_config` (the same objects, not
copies).
"""

from speedtronic_config import *  # noqa: F403
from speedtronic_config import __all__  # noqa: F401
