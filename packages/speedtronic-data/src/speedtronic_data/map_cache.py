"""A bounded cache of opened shards: the least recently used is closed once `limit` are open."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any


class MapCache:
    """Opened shards by index, at most `limit` at once; pickles (into a worker) empty.

    Every open map holds a file descriptor and is one of a process's vm.max_map_count (65530 by
    default) areas, so a corpus of any shard count reads through a window of them instead of
    holding one per shard.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._open: OrderedDict[int, Any] = OrderedDict()

    def get(self, index: int, open_shard: Callable[[int], Any]) -> Any:
        """Return shard `index`, opened by open_shard(index) unless it is open already."""
        opened = self._open.get(index)
        if opened is None:
            opened = self._open[index] = open_shard(index)
            if len(self._open) > self.limit:
                self._open.popitem(last=False)  # its map closes with the last view of it
        else:
            self._open.move_to_end(index)
        return opened

    def __len__(self) -> int:
        return len(self._open)

    def __getstate__(self) -> dict[str, Any]:
        # Maps would pickle as full copies of the shards; each process opens its own.
        return {"limit": self.limit}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["limit"])


__all__ = ["MapCache"]
