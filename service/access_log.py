"""The access log without query strings: they can carry label values, search text or a token
someone put in a URL by mistake, and the log is kept longer and read more widely than the
database.

uvicorn's access logger formats `(client, method, path with query, HTTP version, status)`;
the filter replaces the query with a marker before any handler sees the record.
"""

from __future__ import annotations

import logging

ACCESS_LOGGER = "uvicorn.access"
REDACTED = "?[redacted]"


class RedactQuery(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) == 5 and isinstance(args[2], str) and "?" in args[2]:
            path = args[2].split("?", 1)[0] + REDACTED
            record.args = (args[0], args[1], path, args[3], args[4])
        return True


def install() -> None:
    """Idempotent: an app started twice in one process adds one filter."""
    logger = logging.getLogger(ACCESS_LOGGER)
    if not any(isinstance(f, RedactQuery) for f in logger.filters):
        logger.addFilter(RedactQuery())
