"""2.0 import path `speedtronic.registry`: the objects of `speedtronic_model.registry` (the same
objects, not copies).
"""

from speedtronic_model.registry import *  # noqa: F403
from speedtronic_model.registry import __all__  # noqa: F401
