"""2.0 import path `speedtronic.distributed.tensors`: the objects of `speedtronic_diloco.tensors`
(the same objects, not copies).
"""

from speedtronic_diloco.tensors import *  # noqa: F403
from speedtronic_diloco.tensors import __all__  # noqa: F401
