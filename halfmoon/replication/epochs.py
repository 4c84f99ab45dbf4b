"""The epoch → start-offset table: which epoch's master wrote which part of the log.

Each line of ``<data_dir>/replication/epochs`` is ``EPOCH START``: from commit-log
offset START on, the log was written by the master of EPOCH (until the next
line's START). A master adds a line when it takes office (its log's end at
that moment); a replica copies its master's lines as its log reaches them.
It is Kafka's leader-epoch checkpoint: when a deposed master returns, the
table tells where its log and the new master's part ways, so it can cut its
unreplicated tail.

Finding where two logs part (Kafka's OffsetsForLeaderEpoch, with KIP-279's
answer for a master that never knew the asker's epoch): the returning member
asks the master for the end of its own newest epoch E. The master answers
with the newest epoch E' <= E in *its* table and where E' ends there (the
start of its next epoch, or its log's end when E' is its current one). Up to
that offset both logs hold E'-or-older records written by the same masters;
the member's own E' part ends at the start of its next epoch after E'. The
logs agree below the smaller of the two ends and of the member's log end
(:func:`divergence`). The member cuts there, forgets its epochs the master
does not have, and asks again until the answer cuts nothing: each round
either cuts or ends, so several epochs that passed while it was away are
walked back one at a time.

The file is rewritten whole (temporary file, fsync, rename, fsync of the
directory): a crash leaves the old table or the new one, never half of one.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from halfmoon.errors import CorruptionError
from halfmoon.store.fsutil import fsync_directory

FILE = "epochs"


class EpochTable:
    def __init__(self, data_dir: Path) -> None:
        self.directory = data_dir / "replication"
        self.path = self.directory / FILE
        self._lock = threading.Lock()
        self._entries: list[tuple[int, int]] = self._load()

    def _load(self) -> list[tuple[int, int]]:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return []
        entries = []
        for number, line in enumerate(text.splitlines(), 1):
            try:
                epoch, start = (int(part) for part in line.split())
            except ValueError:
                raise CorruptionError(
                    f"{self.path}:{number}: expected 'EPOCH START', found {line!r}"
                ) from None
            entries.append((epoch, start))
        return entries

    @property
    def entries(self) -> list[tuple[int, int]]:
        return list(self._entries)

    @property
    def latest(self) -> int:
        """The newest epoch recorded (0: none)."""
        entries = self._entries
        return entries[-1][0] if entries else 0

    def record(self, epoch: int, start: int) -> bool:
        """Add ``epoch`` starting at ``start`` unless it is not newer than the latest; whether
        it was added."""
        with self._lock:
            if epoch <= self.latest:
                return False
            entries = [*self._entries, (epoch, start)]
            self._write(entries)
            self._entries = entries
            return True

    def end_of(self, epoch: int, log_end: int) -> tuple[int, int]:
        """``(E', end)``: the newest epoch ``E' <= epoch`` recorded and where its part of the log
        ends (the next epoch's start, or ``log_end``); ``(0, -1)`` when none is that old."""
        entries = self._entries
        older = [i for i, (e, _start) in enumerate(entries) if e <= epoch]
        if not older:
            return 0, -1
        i = older[-1]
        return entries[i][0], entries[i + 1][1] if i + 1 < len(entries) else log_end

    def truncate(self, epoch: int, offset: int) -> None:
        """Forget the epochs newer than ``epoch`` and any starting past ``offset`` (the log was
        cut there)."""
        with self._lock:
            entries = [(e, s) for e, s in self._entries if e <= epoch and s <= offset]
            if entries != self._entries:
                self._write(entries)
                self._entries = entries

    def _write(self, entries: list[tuple[int, int]]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_suffix(".tmp")
        with open(temporary, "w") as file:
            file.write("".join(f"{epoch} {start}\n" for epoch, start in entries))
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, self.path)
        fsync_directory(self.directory)


def divergence(
    own: list[tuple[int, int]], own_end: int, asked: int, answered: int, master_end: int
) -> int:
    """Where the member's log must be cut (``own_end``: nothing to cut), given its table, its
    log's end, the epoch it asked about and the master's answer (see the module)."""
    if master_end < 0:
        return own_end  # the master knows no epoch this old: nothing to compare
    cut = min(own_end, master_end)
    if answered < asked:
        # The master never knew the member's newer epochs: the member's own part of the
        # answered epoch ends where its next epoch began.
        later = [start for epoch, start in own if epoch > answered]
        if later:
            cut = min(cut, later[0])
    return cut
