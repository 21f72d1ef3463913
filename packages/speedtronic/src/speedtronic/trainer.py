"""2.0 import path `speedtronic.trainer`: the objects of `speedtronic_trainer.trainer` (the same
objects, not copies).
"""

from speedtronic_trainer.trainer import *  # noqa: F403
from speedtronic_trainer.trainer import __all__  # noqa: F401
