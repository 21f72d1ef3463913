"""2.0 import path `speedtronic.optimizers`: the objects of `speedtronic_optim` (the same objects,
not copies).
"""

from speedtronic_optim import *  # noqa: F403
from speedtronic_optim import __all__  # noqa: F401
