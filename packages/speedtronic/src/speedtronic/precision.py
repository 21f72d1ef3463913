"""2.0 import path `speedtronic.precision`: the objects of `speedtronic_systems.precision` (the same
objects, not copies).
"""

from speedtronic_systems.precision import *  # noqa: F403
from speedtronic_systems.precision import __all__  # noqa: F401
