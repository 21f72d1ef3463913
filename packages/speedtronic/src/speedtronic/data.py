"""2.0 import path `speedtronic.data`: the objects of `speedtronic_data` (the same objects, not
copies).
"""

from speedtronic_data import *  # noqa: F403
from speedtronic_data import __all__  # noqa: F401
