"""2.0 import path `speedtronic.hooks`: the objects of `speedtronic_trainer.hooks` (the same
objects, not copies).
"""

from speedtronic_trainer.hooks import *  # noqa: F403
from speedtronic_trainer.hooks import __all__  # noqa: F401
