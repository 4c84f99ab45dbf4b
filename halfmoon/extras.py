"""Optional dependencies, named by the extra that installs them.

halfmoon's broker runs on its base dependencies; the database toolkit, the
Spark connector and the RabbitMQ targets need more (``[project.optional-dependencies]``
in pyproject.toml). A module that needs an extra calls :func:`require` before
its first third-party import, so a missing package reads as one line that
names the extra and the command that installs it, instead of a
``ModuleNotFoundError`` from deep inside an import chain.
"""

from __future__ import annotations

import importlib.util

from halfmoon.errors import HalfmoonError

# extra -> the top-level modules it provides (the ones halfmoon imports).
EXTRAS: dict[str, tuple[str, ...]] = {
    "db": ("sqlalchemy",),
    "spark": ("pyspark", "pyarrow", "sqlalchemy"),
    "amqp": ("aio_pika",),
}


class MissingExtra(HalfmoonError, ModuleNotFoundError):
    """A feature needs an optional extra that is not installed.

    Also a :class:`ModuleNotFoundError`, so code that guards an optional import with
    ``except ImportError`` keeps working.
    """

    code = "MISSING_EXTRA"
    protocol_code = "INTERNAL_ERROR"
    http_status = 500  # the server lacks a package: its fault, not the caller's

    def __init__(self, extra: str, missing: list[str]) -> None:
        super().__init__(
            f"{', '.join(missing)} not installed: this needs halfmoon's '{extra}' extra; "
            f"install it with `./run install {extra}` in a checkout, "
            f"or `pip install 'halfmoon[{extra}]'` from a wheel",
        )
        self.extra = extra
        self.missing = missing
        self.name = missing[0]  # ModuleNotFoundError's attribute: the first missing module


def missing(extra: str) -> list[str]:
    """The modules of ``extra`` that cannot be imported here."""
    return [name for name in EXTRAS[extra] if importlib.util.find_spec(name) is None]


def require(extra: str) -> None:
    """Raise :class:`MissingExtra` unless every module of ``extra`` is importable."""
    absent = missing(extra)
    if absent:
        raise MissingExtra(extra, absent)
