"""No module of halfmoon/ is over 600 lines: past that a module is usually two ideas.

A class that outgrows a module becomes several objects that hold their parts
(the message store holds its reader, writer and visibility), not one class
spread over files.
"""

from __future__ import annotations

from pathlib import Path

import halfmoon

ROOT = Path(next(iter(halfmoon.__path__)))
MAX_LINES = 600


def _sizes() -> dict[str, int]:
    return {
        str(path.relative_to(ROOT.parent)): len(path.read_text().splitlines())
        for path in sorted(ROOT.rglob("*.py"))
    }


def test_the_count_sees_every_package() -> None:
    sizes = _sizes()
    assert "halfmoon/store/store.py" in sizes and "halfmoon/broker/broker.py" in sizes
    assert sizes["halfmoon/store/store.py"] > 100  # lines counted, not files


def test_no_module_is_over_600_lines() -> None:
    over = {name: lines for name, lines in _sizes().items() if lines > MAX_LINES}
    assert over == {}, f"split these along their ideas (at most {MAX_LINES} lines each): {over}"
