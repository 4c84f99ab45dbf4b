"""A SparkSession with the ``halfmoon`` format registered: ``local[*]`` by default, any master by
flag.

Spark's Python workers must run the driver's interpreter (the one halfmoon is
installed in), so ``PYSPARK_PYTHON`` / ``PYSPARK_DRIVER_PYTHON`` are set to
``sys.executable`` unless the environment already names one. Moving a job to a
cluster is ``master="spark://host:7077"`` (or ``--master`` on the CLI); the
cluster's workers then need halfmoon installed in the interpreter they run.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

from halfmoon.spark.source import HalfmoonDataSource

DEFAULT_MASTER = "local[*]"

# Small local defaults: a laptop-sized shuffle and no UI port races between test runs.
_LOCAL_CONFIG = {
    "spark.sql.shuffle.partitions": "4",
    "spark.ui.enabled": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.python.worker.reuse": "true",
}


def build_session(
    app_name: str = "halfmoon", master: str | None = None, config: Mapping[str, str] | None = None
) -> SparkSession:
    """Get or create the SparkSession for ``master`` (default ``local[*]``) with ``halfmoon``
    registered."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name).master(master or DEFAULT_MASTER)
    for key, value in {**_LOCAL_CONFIG, **dict(config or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    register(spark)
    return spark


def register(spark: SparkSession) -> None:
    """Register the ``halfmoon`` format with ``spark`` (idempotent)."""
    spark.dataSource.register(HalfmoonDataSource)
