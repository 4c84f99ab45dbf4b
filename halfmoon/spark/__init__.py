"""halfmoon's Spark connector: the ``halfmoon`` data source for PySpark 4.2+.

    spark = build_session()                      # local[*], format registered
    df = spark.read.format("halfmoon").option("endpoint", "127.0.0.1:8081").option("topic",
"orders").load()
    query = (df.writeStream.format("halfmoon").option("endpoint", ...).option("topic", "out")
             .option("checkpointLocation", "/tmp/ckpt").start())

See ``docs/spark.md``: the source (:mod:`halfmoon.spark.source`), the
exactly-once sink (:mod:`halfmoon.spark.sink`) and the jobs behind
``halfmoon spark audit`` and ``halfmoon spark stats``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

# ruff: noqa: E402 (the extra is checked before the imports that need it)
from halfmoon.extras import require

require("spark")  # before the first pyarrow/pyspark import: a missing extra is one clear line

from halfmoon.spark.options import DataLossError, SparkOptionError
from halfmoon.spark.rows import ARROW_SCHEMA, SCHEMA_DDL

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

FORMAT = "halfmoon"


def register(spark: SparkSession) -> None:
    """Register the ``halfmoon`` format with ``spark`` (idempotent)."""
    # here, not at the top: pyspark is optional, and importing halfmoon.spark must not need it
    from halfmoon.spark.session import register as register_format

    register_format(spark)


def build_session(
    app_name: str = "halfmoon", master: str | None = None, config: dict[str, str] | None = None
) -> SparkSession:
    """A SparkSession (``local[*]`` unless ``master``) with the format registered."""
    from halfmoon.spark.session import build_session as build  # here: pyspark is optional

    return build(app_name, master, config)


__all__ = [
    "ARROW_SCHEMA",
    "FORMAT",
    "SCHEMA_DDL",
    "DataLossError",
    "SparkOptionError",
    "build_session",
    "register",
]
