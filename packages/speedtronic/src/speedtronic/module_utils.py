"""2.0 import path `speedtronic.module_utils`: the objects of `speedtronic_model.module_utils` (the
same objects, not copies).
"""

from speedtronic_model.module_utils import *  # noqa: F403
from speedtronic_model.module_utils import __all__  # noqa: F401
