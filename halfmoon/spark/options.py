"""The ``halfmoon`` format's options, parsed once and checked with messages a user can act on.

Names follow Spark's Kafka source where an equivalent exists
(``startingOffsets``, ``endingOffsets``, ``maxRecordsPerTrigger``,
``failOnDataLoss``); Spark hands them over case-insensitively.

=====================  =====================================================================
``endpoint``           ``host:port`` of a halfmoon server (gRPC). Required.
``topic``/``topics``   one topic, or several separated by commas. Required to read.
``queues``             only these queue ids (comma-separated), in every topic read.
``startingOffsets``    ``earliest`` (default for batch), ``latest`` (default for streams),
                       JSON ``{"topic": {"0": 12, "1": -2}}`` (-2 earliest, -1 latest), or
                       ``timestamp:<epoch ms>`` (first message stored at or after it).
``endingOffsets``      batch only: ``latest`` (default), JSON, or ``timestamp:<epoch ms>``.
``maxRecordsPerTrigger``  streams: at most this many offsets per micro-batch (admission control).
``failOnDataLoss``     ``true`` (default): fail when retention removed unread messages;
                       ``false``: log a warning and continue from the oldest kept message.
``filter``             a filter expression evaluated by the broker; ``filterType`` says
                       which: ``tag`` (default, ``"A || B"``) or ``sql92``.
``group``              the consumer group the reads are made as (default ``halfmoon-spark``).
``commitOffsets``      streams: ``true`` stores each finished batch's end offsets as ``group``'s
                       committed offsets, so ``halfmoon consumer progress`` shows the lag.
``maxRecordsPerPartition``  split a queue's range into tasks of at most this many offsets.
``accessKey``          with ``secretKey``: sign every request (a broker with authentication on);
                       default ``$HALFMOON_ACCESS_KEY`` / ``$HALFMOON_SECRET_KEY``. The secret is
                       never logged; Spark's ``spark.redaction.regex`` hides it in plans.
``tls``                ``true``: connect over TLS (default: true when a ``tls*`` file is given).
``tlsRootCertificates``  PEM bundle of the CAs to trust (default: the system roots).
``tlsCertificateChain``  with ``tlsPrivateKey``: PEM client certificate and key (mutual TLS).
=====================  =====================================================================

The ``tls*`` options are paths, valid on the driver and on every executor
(``spark-submit --files`` ships them); the files are read where a channel is
opened, so no certificate or key ever sits in the options, a plan or a log.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from rocketmq.grpc_protocol import definition_pb2 as pb

from halfmoon.client.credentials import Credentials
from halfmoon.client.endpoints import check_endpoints, split_endpoints
from halfmoon.errors import InvalidArgument

EARLIEST = -2
LATEST = -1
DEFAULT_GROUP = "halfmoon-spark"


class SparkOptionError(InvalidArgument):
    """An option of the ``halfmoon`` Spark format is missing or malformed."""

    code = "SPARK_BAD_OPTION"
    protocol_code = "BAD_REQUEST"


class DataLossError(InvalidArgument):
    """Messages a query still had to read were removed by retention."""

    code = "SPARK_DATA_LOSS"
    protocol_code = "BAD_REQUEST"


@dataclass(frozen=True)
class OffsetSpec:
    """Where to start or stop: ``kind`` is ``earliest``, ``latest``, ``json`` or ``timestamp``."""

    kind: str
    per_queue: Mapping[str, Mapping[str, int]] | None = None
    timestamp_ms: int | None = None


@dataclass(frozen=True)
class TlsOptions:
    """TLS to the server: paths of PEM files (never their contents: options travel in plans)."""

    root_certificates: str | None = None  # None: the system roots
    certificate_chain: str | None = None  # with private_key: mutual TLS
    private_key: str | None = None


@dataclass(frozen=True)
class SourceOptions:
    endpoint: str
    topics: tuple[str, ...]
    queues: frozenset[int] | None
    starting: OffsetSpec
    ending: OffsetSpec
    max_records_per_trigger: int | None
    fail_on_data_loss: bool
    filter: tuple[str, str] | None  # ("TAG" or "SQL92", expression); protobuf does not pickle
    group: str
    commit_offsets: bool
    max_records_per_partition: int
    pull_batch_size: int
    credentials: Credentials | None = None  # repr leaves the secret out
    tls: TlsOptions | None = None


def option_value(options: Mapping[str, str], name: str) -> str | None:
    """The option ``name`` (matched case-insensitively), or None."""
    # Spark passes a case-insensitive dict; plain dicts (tests, jobs) may not be.
    value = options.get(name)
    if value is None:
        value = next((v for k, v in options.items() if k.lower() == name.lower()), None)
    return None if value is None else str(value)


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    value = option_value(options, name)
    if value is None:
        return default
    if value.strip().lower() in ("true", "1", "yes"):
        return True
    if value.strip().lower() in ("false", "0", "no"):
        return False
    raise SparkOptionError(f"option {name} must be true or false, got {value!r}")


def _positive(options: Mapping[str, str], name: str, default: int | None) -> int | None:
    value = option_value(options, name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise SparkOptionError(f"option {name} must be a positive integer, got {value!r}")
    return number


def credentials_of(options: Mapping[str, str]) -> Credentials | None:
    """``accessKey`` and ``secretKey`` (both or neither), else the environment's."""
    access_key, secret_key = option_value(options, "accessKey"), option_value(options, "secretKey")
    if access_key and secret_key:
        return Credentials(access_key, secret_key)
    if access_key or secret_key:
        raise SparkOptionError("options accessKey and secretKey go together; give both or neither")
    return Credentials.from_env()


def tls_of(options: Mapping[str, str]) -> TlsOptions | None:
    """The ``tls`` options: None for plaintext."""
    files = {
        name: (option_value(options, name) or "").strip() or None
        for name in ("tlsRootCertificates", "tlsCertificateChain", "tlsPrivateKey")
    }
    chain, key = files["tlsCertificateChain"], files["tlsPrivateKey"]
    if (chain is None) != (key is None):
        raise SparkOptionError(
            "options tlsCertificateChain and tlsPrivateKey go together (mutual TLS); "
            "give both or neither"
        )
    given = [name for name, path in files.items() if path is not None]
    enabled = _bool(options, "tls", bool(given))
    if not enabled:
        if given:
            raise SparkOptionError(f"option tls=false contradicts option {given[0]}")
        return None
    return TlsOptions(files["tlsRootCertificates"], chain, key)


def endpoint_of(options: Mapping[str, str]) -> str:
    """``host:port``, or a cluster's proxies ``host:port;host:port`` (failed over between)."""
    endpoint = (option_value(options, "endpoint") or "").strip()
    try:
        return ";".join(split_endpoints(check_endpoints(endpoint)))
    except ValueError:
        raise SparkOptionError(
            "option endpoint must be host:port of a halfmoon server (or several, ';'-separated: "
            f"a cluster's proxies), got {endpoint!r}"
        ) from None


def offset_spec(text: str, name: str) -> OffsetSpec:
    value = text.strip()
    if value.lower() in ("earliest", "latest"):
        return OffsetSpec(value.lower())
    if value.lower().startswith("timestamp:"):
        stamp = value.split(":", 1)[1].strip()
        if not stamp.isdigit():
            raise SparkOptionError(
                f"option {name}: timestamp:<epoch milliseconds> expected, got {value!r}"
            )
        return OffsetSpec("timestamp", timestamp_ms=int(stamp))
    try:
        parsed = json.loads(value)
        per_queue = {
            str(t): {str(q): int(o) for q, o in queues.items()} for t, queues in parsed.items()
        }
    except (ValueError, AttributeError, TypeError):
        raise SparkOptionError(
            f"option {name} must be earliest, latest, timestamp:<ms> or JSON like "
            f'{{"orders": {{"0": 42}}}}, got {value!r}'
        ) from None
    return OffsetSpec("json", per_queue=per_queue)


def filter_of(options: Mapping[str, str]) -> tuple[str, str] | None:
    expression = option_value(options, "filter")
    if expression is None or not expression.strip():
        return None
    kind = (option_value(options, "filterType") or "tag").strip().lower()
    if kind == "tag":
        return ("TAG", expression.strip())
    if kind in ("sql92", "sql"):
        return ("SQL92", expression.strip())
    raise SparkOptionError(f"option filterType must be tag or sql92, got {kind!r}")


def selector_wire(spec: tuple[str, str] | None) -> pb.FilterExpression | None:
    """The protocol FilterExpression of a parsed ``filter`` option."""
    if spec is None:
        return None
    kind = pb.FilterType.SQL if spec[0] == "SQL92" else pb.FilterType.TAG
    return pb.FilterExpression(type=kind, expression=spec[1])


def source_options(options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    """Parse and check the reader options (``streaming`` picks the defaults)."""
    names = option_value(options, "topics") or option_value(options, "topic") or ""
    topics = tuple(t.strip() for t in names.split(",") if t.strip())
    if not topics:
        raise SparkOptionError(
            "option topic (or topics, comma-separated) is required to read from halfmoon"
        )
    queues_text = option_value(options, "queues")
    queues = None
    if queues_text:
        try:
            queues = frozenset(int(q) for q in queues_text.split(",") if q.strip())
        except ValueError:
            raise SparkOptionError(
                f"option queues must be comma-separated queue ids, got {queues_text!r}"
            ) from None
    starting = offset_spec(
        option_value(options, "startingOffsets") or ("latest" if streaming else "earliest"),
        "startingOffsets",
    )
    ending_text = option_value(options, "endingOffsets")
    if streaming and ending_text is not None:
        raise SparkOptionError(
            "option endingOffsets is for batch reads; a stream has no end (use a trigger instead)"
        )
    ending = offset_spec(ending_text or "latest", "endingOffsets")
    if ending.kind == "earliest":
        raise SparkOptionError("option endingOffsets cannot be earliest (that reads nothing)")
    max_per_trigger = _positive(options, "maxRecordsPerTrigger", None)
    if max_per_trigger is not None and not streaming:
        raise SparkOptionError(
            "option maxRecordsPerTrigger is for streaming reads; bound a batch with endingOffsets"
        )
    return SourceOptions(
        endpoint=endpoint_of(options),
        topics=topics,
        queues=queues,
        starting=starting,
        ending=ending,
        max_records_per_trigger=max_per_trigger,
        fail_on_data_loss=_bool(options, "failOnDataLoss", True),
        filter=filter_of(options),
        group=(option_value(options, "group") or DEFAULT_GROUP).strip(),
        commit_offsets=_bool(options, "commitOffsets", False),
        max_records_per_partition=_positive(options, "maxRecordsPerPartition", 200_000) or 200_000,
        # Messages per read (BulkRead answers; PullMessage caps it at 1024).
        pull_batch_size=min(_positive(options, "pullBatchSize", 4096) or 4096, 16384),
        credentials=credentials_of(options),
        tls=tls_of(options),
    )
