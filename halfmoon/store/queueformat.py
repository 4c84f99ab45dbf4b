"""The consume-queue file format: entries, file and directory names.

The layout, with a worked example, is in ``docs/storage-format.md``; keep the
two in step. ``<root>/<topic>/<queue_id>/<20-digit first queue offset>``:
each file is a dense array of 20-byte big-endian entries::

    0   i64  commit_log_offset
    8   i32  size             bytes of the record; TRIMMED_SIZE once retention removed it
    12  i64  tag_hash

A file is created at full length (sparse), so an all-zero entry means "not
written yet". Records are never empty, so a real entry is never all zero.
Entries carry no checksum.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from dataclasses import dataclass

ENTRY = struct.Struct(">qiq")  # commit_log_offset, size, tag_hash
ENTRY_SIZE = ENTRY.size  # 20
SIZE_AT = 8  # byte position of the size field inside an entry
TRIMMED_SIZE = -1  # the size field of an entry retention has removed
ZERO_ENTRY = bytes(ENTRY_SIZE)
# The four bytes retention writes over the size field of a trimmed entry.
TRIMMED_MARKER = ENTRY.pack(0, TRIMMED_SIZE, 0)[SIZE_AT : SIZE_AT + 4]
FILE_NAME = re.compile(r"^\d{20}$")
QUEUE_DIR_NAME = re.compile(r"^(0|[1-9]\d{0,9})$")  # exactly str(queue_id)

assert struct.calcsize(">q") == SIZE_AT


def file_name(start: int) -> str:
    """The name of the file whose first entry is at queue offset ``start``."""
    return f"{start:020d}"


@dataclass(frozen=True, slots=True)
class QueueEntry:
    queue_offset: int
    commit_log_offset: int
    size: int
    tag_hash: int


# The slot descriptors' setters (see make_entry), taken from the class dict so
# the type checker sees plain callables rather than instance attributes.
_Setter = Callable[[QueueEntry, int], None]
_set_queue_offset: _Setter = QueueEntry.__dict__["queue_offset"].__set__
_set_commit_log_offset: _Setter = QueueEntry.__dict__["commit_log_offset"].__set__
_set_size: _Setter = QueueEntry.__dict__["size"].__set__
_set_tag_hash: _Setter = QueueEntry.__dict__["tag_hash"].__set__


def make_entry(queue_offset: int, commit_log_offset: int, size: int, tag_hash: int) -> QueueEntry:
    """A QueueEntry at almost half the cost of the frozen dataclass's ``__init__``.

    The generated ``__init__`` goes through ``object.__setattr__`` per field;
    the slot descriptors are set directly instead (reads are the hot path).
    """
    entry = object.__new__(QueueEntry)
    _set_queue_offset(entry, queue_offset)
    _set_commit_log_offset(entry, commit_log_offset)
    _set_size(entry, size)
    _set_tag_hash(entry, tag_hash)
    return entry
