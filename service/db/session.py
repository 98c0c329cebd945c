"""Engine and session factory; SQLite gets WAL and a busy timeout so several processes share it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

_WRITE_OPTION = "kvcanary_write"


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    # Transactions are begun by _begin_immediate below, not by the driver.
    dbapi_connection.isolation_level = None
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
            url, connect_args={"check_same_thread": False, "timeout": 30}, pool_size=40, max_overflow=40
        )
        event.listen(engine, "connect", _sqlite_pragmas)
        event.listen(engine, "begin", _begin)
        return engine
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
