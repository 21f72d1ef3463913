"""2.0 import path `speedtronic.profiling`: the objects of `speedtronic_trainer.profiling` (the same
objects, not copies).
"""

from speedtronic_trainer.profiling import *  # noqa: F403
from speedtronic_trainer.profiling import __all__  # noqa: F401
