"""``halfmoon spark audit``: does a database table agree with a topic's committed messages?

The table is the source of truth (the transaction log, the outbox or a
business table); every row should have produced exactly one message whose
key is the row's key. The job reports three kinds of disagreement:

* **lost**: a row with no message (the send was lost, or never made);
* **phantom**: a message with no row (sent for a transaction that rolled back);
* **duplicate**: a key carried by more than one message.

The table is read without a JDBC driver: the driver asks the database for the
primary key's range (SQLAlchemy), cuts it into ``partitions`` ranges, and each
Spark task opens its own SQLAlchemy connection and selects one range. So any
database SQLAlchemy speaks works, the read is parallel, and no Java driver
needs installing. The topic is read with the ``halfmoon`` source (committed
messages only). The message key is the first of a message's keys by
default, or a user property (``key_property``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from halfmoon.errors import InvalidArgument

SAMPLE = 20


class AuditError(InvalidArgument):
    """The audit cannot run: the table, a column or the primary key range is unusable."""

    code = "SPARK_AUDIT_ERROR"
    protocol_code = "BAD_REQUEST"


@dataclass(frozen=True)
class AuditSpec:
    database_url: str
    table: str
    key_column: str
    endpoint: str
    topic: str
    primary_key: str | None = None  # an integer column to split the read by; default key_column
    key_property: str | None = None  # match on this user property instead of the message keys
    partitions: int = 4
    where: str | None = None  # an SQL condition on the table's rows (trusted: it is the operator's)


@dataclass
class AuditReport:
    rows: int
    messages: int
    lost: int
    phantom: int
    duplicate: int
    samples: dict[str, list[str]] = field(default_factory=dict)

    @property
    def consistent(self) -> bool:
        return self.lost == 0 and self.phantom == 0 and self.duplicate == 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "consistent": self.consistent,
            "rows": self.rows,
            "messages": self.messages,
            "lost": self.lost,
            "phantom": self.phantom,
            "duplicate": self.duplicate,
            "samples": self.samples,
        }

    def text(self) -> str:
        lines = [
            f"rows in table        {self.rows}",
            f"committed messages   {self.messages}",
            f"lost (row, no msg)   {self.lost}",
            f"phantom (msg, no row) {self.phantom}",
            f"duplicate keys       {self.duplicate}",
        ]
        for kind, keys in self.samples.items():
            if keys:
                lines.append(f"{kind} keys (first {len(keys)}): {', '.join(keys)}")
        lines.append("CONSISTENT" if self.consistent else "INCONSISTENT")
        return "\n".join(lines)


def _identifier(name: str, what: str) -> str:
    # Table and column names go into SQL text: only plain (optionally schema-qualified) names.
    if not name or not all(part.replace("_", "").isalnum() for part in name.split(".")):
        raise AuditError(
            f"{what} {name!r} is not a plain SQL name (letters, digits, '_', optionally "
            "schema.table)"
        )
    return name


def key_ranges(low: int, high: int, parts: int) -> list[tuple[int, int]]:
    """``[low, high]`` cut into at most ``parts`` half-open ranges ``[a, b)`` covering it."""
    if high < low:
        return []
    size = max((high - low + 1 + parts - 1) // parts, 1)
    return [(start, min(start + size, high + 1)) for start in range(low, high + 1, size)]


def _read_range(spec: AuditSpec, bounds: Iterable[tuple[int, int]]) -> Iterator[tuple[str]]:
    engine = sa.create_engine(spec.database_url)
    table, key, pk = spec.table, spec.key_column, spec.primary_key or spec.key_column
    condition = f" AND ({spec.where})" if spec.where else ""
    query = sa.text(f"SELECT {key} FROM {table} WHERE {pk} >= :low AND {pk} < :high{condition}")  # noqa: S608 - names checked
    try:
        with engine.connect() as connection:
            for low, high in bounds:
                for (value,) in connection.execute(query, {"low": low, "high": high}):
                    yield (str(value),)
    finally:
        engine.dispose()


def table_keys(spark: SparkSession, spec: AuditSpec) -> DataFrame:
    """The table's keys as a DataFrame ``(key string)``, read in parallel by primary-key range."""
    _identifier(spec.table, "table")
    _identifier(spec.key_column, "key column")
    pk = _identifier(spec.primary_key or spec.key_column, "primary key column")
    engine = sa.create_engine(spec.database_url)
    try:
        with engine.connect() as connection:
            low, high = connection.execute(
                sa.text(f"SELECT MIN({pk}), MAX({pk}) FROM {spec.table}")
            ).one()  # noqa: S608
    except sa.exc.SQLAlchemyError as exc:
        raise AuditError(
            f"cannot read {spec.table!r} at {engine.url.render_as_string(hide_password=True)}: "
            f"{exc.__class__.__name__}: {str(exc).splitlines()[0]}"
        ) from None
    finally:
        engine.dispose()
    if low is None:
        return spark.createDataFrame([], "key string")
    if not isinstance(low, int) or not isinstance(high, int):
        raise AuditError(
            f"primary key column {pk!r} is not an integer; name an integer column with "
            "--primary-key to split the read"
        )
    ranges = key_ranges(low, high, max(spec.partitions, 1))
    rdd = spark.sparkContext.parallelize(ranges, len(ranges)).mapPartitions(
        lambda part: _read_range(spec, part)
    )
    return spark.createDataFrame(rdd, "key string")


def message_keys(spark: SparkSession, spec: AuditSpec) -> DataFrame:
    """One row ``(key, message_id)`` per committed message of the topic (keyless messages: key
    null)."""
    messages = (
        spark.read.format("halfmoon")
        .option("endpoint", spec.endpoint)
        .option("topic", spec.topic)
        .load()
    )
    if spec.key_property:
        key = F.col("properties").getItem(spec.key_property)
    else:
        key = F.element_at(F.col("keys"), 1)
    return messages.select(key.alias("key"), "message_id")


def run_audit(spark: SparkSession, spec: AuditSpec) -> AuditReport:
    """Reconcile the table with the topic and report."""
    rows = table_keys(spark, spec).cache()
    messages = message_keys(spark, spec).cache()
    row_keys = rows.select("key").distinct()
    sent = messages.where(F.col("key").isNotNull()).groupBy("key").agg(F.count("*").alias("n"))
    lost = row_keys.join(sent, "key", "left_anti")
    phantom = sent.join(row_keys, "key", "left_anti").select("key")
    duplicate = sent.where(F.col("n") > 1).select("key")

    def sample(frame: DataFrame) -> list[str]:
        return sorted(r.key for r in frame.orderBy("key").limit(SAMPLE).collect())

    report = AuditReport(
        rows=rows.count(),
        messages=messages.count(),
        lost=lost.count(),
        phantom=phantom.count(),
        duplicate=duplicate.count(),
    )
    report.samples = {
        "lost": sample(lost),
        "phantom": sample(phantom),
        "duplicate": sample(duplicate),
    }
    rows.unpersist()
    messages.unpersist()
    return report
