"""2.0 import path `speedtronic.model`: the objects of `speedtronic_model.model` (the same objects,
not copies).
"""

from speedtronic_model.model import *  # noqa: F403
from speedtronic_model.model import __all__  # noqa: F401
