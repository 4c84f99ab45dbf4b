"""Child process of test_truncation: opens a store and cuts its log at an offset.

Usage: python -m tests.store.truncate_child DATA_DIR OFFSET
With ``HALFMOON_STORE_FAILPOINT`` set it stops at the named point and waits to be killed.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tests.store.storeutil import open_store


def main() -> None:
    data_dir, offset = Path(sys.argv[1]), int(sys.argv[2])
    store = open_store(data_dir, flush="sync")
    store.truncate(offset)
    store.close()
    print("truncated", flush=True)


if __name__ == "__main__":
    main()
