"""Engine and session factory; SQLite gets WAL and a busy timeout so several processes share it."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

from service.text import shown_everywhere

_WRITE_OPTION = "kvcanary_write"
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _json_loads(text: str) -> Any:
    """JSON columns as stored, except that a lone surrogate (kept as a `\\ud800` escape) reads
    back as visible escape text: a row stored before the request gate refused it must not make
    every list or page that shows it fail to encode."""
    document = json.loads(text)
    return shown_everywhere(document) if _SURROGATE_ESCAPE.search(text) else document


def _text(raw: bytes) -> str:
    """SQLite TEXT that is not UTF-8 (written by another tool) reads with escapes, not an error."""
    return raw.decode("utf-8", "backslashreplace")


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    # Transactions are begun by _begin_immediate below, not by the driver.
    dbapi_connection.isolation_level = None
    dbapi_connection.text_factory = _text
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def _begin(connection: Connection) -> None:
    """Writers take SQLite's write lock when their transaction starts, waiting up to the busy
    timeout; readers take none (WAL gives them a snapshot).

    A deferred transaction that reads and then writes (a token lookup, then a new run) fails
    at once with "database is locked" when another process wrote in between; taking the lock
    first turns that into a short wait. A write transaction must therefore be opened and
    closed in one thread and never held across an await or a thread-pool hop.
    """
    immediate = connection.get_execution_options().get(_WRITE_OPTION, False)
    connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


@lru_cache(maxsize=8)
def get_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        # Request threads each hold a connection; SQLite connections are cheap, so the pool is
        # as large as the web server's thread pool and a burst of requests never waits on it.
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": 30},
            pool_size=40,
            max_overflow=40,
            json_deserializer=_json_loads,
        )
        event.listen(engine, "connect", _sqlite_pragmas)
        event.listen(engine, "begin", _begin)
        return engine
    # PostgreSQL's JSONB refuses a lone surrogate, so none is stored there to escape on reading.
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)


@lru_cache(maxsize=16)
def _factory(url: str, write: bool) -> sessionmaker[Session]:
    return sessionmaker(get_engine(url).execution_options(**{_WRITE_OPTION: write}), expire_on_commit=False)


@contextmanager
def session_scope(url: str, *, write: bool = True) -> Iterator[Session]:
    """One transaction, committed on success and rolled back on any error.

    `write=False` is for reads that may run beside writers for as long as a request lasts.
    """
    session = _factory(url, write)()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
