"""Small helpers shared by the store tests."""

from __future__ import annotations

from pathlib import Path

from halfmoon.store import Message, MessageStore, StoreConfig

SEGMENT = 64 * 1024


def config(data_dir: Path, **overrides) -> StoreConfig:
    settings = {
        "data_dir": data_dir,
        "segment_size": SEGMENT,
        "flush": "async",
        "max_body_size": 16 * 1024,
        "cq_entries_per_file": 64,
        "index_slots": 64,
        "index_max_entries": 256,
        "checkpoint_interval": 30.0,
        "retention_check_interval": 3600.0,
    }
    settings.update(overrides)
    return StoreConfig(**settings)


def open_store(data_dir: Path, store_kwargs: dict | None = None, **overrides) -> MessageStore:
    return MessageStore(config(data_dir, **overrides), **(store_kwargs or {}))


def message(i: int, topic: str = "orders", queue_id: int = 0, size: int = 100, **props) -> Message:
    properties = {"UNIQ_KEY": f"id-{topic}-{i}", "KEYS": f"key-{i}", **props}
    body = (f"{i:08d}".encode() * (size // 8 + 1))[:size]
    return Message(topic=topic, body=body, queue_id=queue_id, properties=properties)


class Reporter:
    """Collects (offset, bytes dropped, reason) reports."""

    def __init__(self) -> None:
        self.reports: list[tuple[int, int, str]] = []

    def __call__(self, offset: int, dropped: int, reason: str) -> None:
        self.reports.append((offset, dropped, reason))
