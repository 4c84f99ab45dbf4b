"""Fixtures: a broker over the in-memory store with a fake clock, and one over real files."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from halfmoon.broker import Broker, BrokerConfig, FakeClock
from halfmoon.store.config import StoreConfig
from halfmoon.store.memory import MemoryStore
from halfmoon.store.store import MessageStore


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(clock: FakeClock) -> MemoryStore:
    return MemoryStore(clock.now_ms)


@pytest.fixture
def metadata_dir(tmp_path: Path) -> Path:
    return tmp_path / "meta"


@pytest.fixture
def broker(store: MemoryStore, clock: FakeClock, metadata_dir: Path) -> Iterator[Broker]:
    b = Broker(store, metadata_dir, BrokerConfig(), clock)
    yield b
    b.close()


def open_real_store(data_dir: Path) -> MessageStore:
    """A real MessageStore with small files (sync flush)."""
    return MessageStore(
        StoreConfig(
            data_dir=data_dir,
            segment_size=4 * 1024 * 1024,
            flush="sync",
            cq_entries_per_file=1024,
            index_slots=1024,
            index_max_entries=4096,
        )
    )


@pytest.fixture
def real_broker(tmp_path: Path, clock: FakeClock) -> Iterator[Callable[..., Broker]]:
    """Open (and reopen) a broker over a real MessageStore in ``tmp_path``; closes all at
    the end."""
    opened: list[tuple[Broker, MessageStore]] = []

    def open_broker(config: BrokerConfig | None = None) -> Broker:
        for b, s in opened:  # a reopen: close the previous instance first
            b.close()
            s.close()
        opened.clear()
        s = open_real_store(tmp_path / "data")
        b = Broker(s, tmp_path / "meta", config or BrokerConfig(), clock)
        opened.append((b, s))
        return b

    yield open_broker
    for b, s in opened:
        b.close()
        s.close()
