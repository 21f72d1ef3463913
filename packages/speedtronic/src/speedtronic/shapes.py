"""2.0 import path `speedtronic.shapes`: the objects of `speedtronic_systems.shapes` (the same
objects, not copies).
"""

from speedtronic_systems.shapes import *  # noqa: F403
from speedtronic_systems.shapes import __all__  # noqa: F401
