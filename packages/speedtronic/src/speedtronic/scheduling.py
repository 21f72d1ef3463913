"""2.0 import path `speedtronic.scheduling`: the objects of `speedtronic_systems.scheduling` (the
same objects, not copies).
"""

from speedtronic_systems.scheduling import *  # noqa: F403
from speedtronic_systems.scheduling import __all__  # noqa: F401
