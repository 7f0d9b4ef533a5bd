"""Producer-id allocation that never hands out an id twice, even across crashes.

Ids are reserved in blocks: before the first id of a block is handed out, the
end of the block is written durably to ``producer-ids`` (``next-block-start N``).
After a crash the allocator starts at that mark, skipping whatever was left
of the reserved block: ids may be skipped, never reused.
"""

from __future__ import annotations

import os

from storage.durable import replace_file

BLOCK_SIZE = 1000
FILE_NAME = "producer-ids"


class ProducerIdAllocator:
    def __init__(self, directory: str, *, block_size: int = BLOCK_SIZE):
        self.path = os.path.join(directory, FILE_NAME)
        self.block_size = block_size
        self._next = self._read_mark()
        self._block_end = self._next  # nothing reserved in this process yet

    def _read_mark(self) -> int:
        try:
            with open(self.path, encoding="ascii") as file:
                key, _, value = file.read().strip().partition(" ")
            if key != "next-block-start":
                raise ValueError(f"{self.path} is not a producer-id mark")
            return int(value)
        except FileNotFoundError:
            return 0

    def _reserve(self) -> None:
        end = self._next + self.block_size
        replace_file(self.path, f"next-block-start {end}\n".encode("ascii"))
        self._block_end = end

    def allocate(self) -> int:
        if self._next >= self._block_end:
            self._reserve()
        producer_id = self._next
        self._next += 1
        return producer_id
