"""2.0 import path `speedtronic.checkpoint`: the objects of `speedtronic_trainer.checkpoint` (the
same objects, not copies).
"""

from speedtronic_trainer.checkpoint import *  # noqa: F403
from speedtronic_trainer.checkpoint import __all__  # noqa: F401
