"""``halfmoon.v1.BulkRead``: many committed messages of one queue per answer, beside the
RocketMQ protocol (docs/bulk-read.md).

The format (:mod:`halfmoon.bulkread.format`) is shared by the server
(:mod:`halfmoon.server.bulk_rpc`), halfmoon's ``PullConsumer`` and the Spark
source; it needs msgpack only, never pyarrow: the Spark source turns the
columns into Arrow record batches on its side.
"""

from halfmoon.bulkread.format import (
    COLUMNS,
    FORMAT_VERSION,
    METHOD,
    SERVICE,
    BulkAnswer,
    BulkRequest,
    FormatError,
)

__all__ = [
    "COLUMNS",
    "FORMAT_VERSION",
    "METHOD",
    "SERVICE",
    "BulkAnswer",
    "BulkRequest",
    "FormatError",
]
