"""2.0 import path `speedtronic.integrations`: the objects of `speedtronic_trainer.integrations`
(the same objects, not copies).
"""

from speedtronic_trainer.integrations import *  # noqa: F403
from speedtronic_trainer.integrations import __all__  # noqa: F401
