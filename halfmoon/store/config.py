"""StoreConfig: every knob of the message store, with the defaults that just work."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from halfmoon.errors import InvalidArgument

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB


@dataclass(frozen=True)
class StoreConfig:
    """Configuration of one :class:`~halfmoon.store.store.MessageStore`.

    ``data_dir`` holds ``commitlog/``, ``consumequeue/``, ``index/``, the
    ``checkpoint`` and the ``abort`` marker.
    """

    data_dir: Path
    segment_size: int = 1 * GiB  # commit-log segment bytes (multiple of the page size)
    flush: Literal["sync", "async"] = "sync"  # sync: ack after fsync (group commit)
    flush_interval: float = 0.5  # seconds between background fsyncs under async
    recovery: Literal["strict", "lenient"] = "strict"  # mid-log damage: raise, or skip it
    retention_hours: float = 72.0  # segments older than this are deleted
    disk_usage_ratio: float = 0.75  # above this disk usage, oldest segments are deleted
    max_body_size: int = 4 * MiB
    max_properties_size: int = 32 * KiB  # encoded bytes; the format allows 65535
    cq_entries_per_file: int = 300_000  # 20-byte entries per consume-queue file
    index_slots: int = 500_000  # hash slots per key-index file
    index_max_entries: int = 2_000_000  # entries per key-index file
    store_host: str = ""  # written into every record ("host:port")
    retention_check_interval: float = 10.0  # seconds between retention runs
    checkpoint_interval: float = 1.0  # seconds between checkpoints (bounds recovery work)
    max_scan_entries: int = 800  # consume-queue entries one filtered get may examine
    verify_crc_on_read: bool = False  # get(): recheck each record's CRC (read_at always does)

    def __post_init__(self) -> None:
        object.__setattr__(self, "data_dir", Path(self.data_dir))
        problems = []
        if self.flush not in ("sync", "async"):
            problems.append(f"flush must be 'sync' or 'async', not {self.flush!r}")
        if self.recovery not in ("strict", "lenient"):
            problems.append(f"recovery must be 'strict' or 'lenient', not {self.recovery!r}")
        if self.segment_size < 64 * KiB or self.segment_size % 4096:
            problems.append("segment_size must be a multiple of 4096 and at least 64 KiB")
        if not 0.0 < self.disk_usage_ratio <= 1.0:
            problems.append("disk_usage_ratio must be in (0, 1]")
        if self.max_body_size < 0 or not 0 <= self.max_properties_size <= 65535:
            problems.append("max_body_size must be >= 0 and max_properties_size in [0, 65535]")
        if min(self.flush_interval, self.retention_check_interval, self.checkpoint_interval) <= 0:
            problems.append("intervals must be positive")
        if self.retention_hours <= 0 or self.max_scan_entries < 1 or self.cq_entries_per_file < 1:
            problems.append(
                "retention_hours, max_scan_entries and cq_entries_per_file must be positive"
            )
        if len(self.store_host.encode("utf-8")) > 255:
            problems.append("store_host must be at most 255 bytes")
        if problems:
            raise InvalidArgument(
                "invalid store configuration: " + "; ".join(problems), code="BAD_CONFIG"
            )
