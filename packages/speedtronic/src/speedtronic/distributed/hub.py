"""2.0 import path `speedtronic.distributed.hub`: speedtronic_diloco's Hub client and its 2.0
alias.
"""

from __future__ import annotations

from speedtronic_diloco.hub import GlobalMetadata, HubClient, HubError, HubUnavailable

HubTransport = HubClient

__all__ = [
    "GlobalMetadata",
    "HubClient",
    "HubError",
    "HubTransport",
    "HubUnavailable",
]
