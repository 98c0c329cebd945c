"""Connection rules of `kvcanary serve`, below the app: how long a client may take to send a
request's headers, and how many connections one client address may hold open.

A client that opens connections and sends half a request costs the service a socket each;
without these rules a few thousand of them from one host hold every socket the process has.
Past the header deadline a connection is answered 408 and closed; past the per-client cap a
new connection is answered 429 (with Retry-After) and closed before its request is read. The
body's own deadline, and the in-flight limit taken once the body is in, are the app's
(`service.api.gate`).

Built on uvicorn's httptools protocol (`uvicorn.Config(http=...)`), which `kvcanary serve` runs.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from service.settings import Settings

RETRY_AFTER_S = 5


def _answer(transport: asyncio.Transport, status: str, message: str, *extra: str) -> None:
    """A whole HTTP/1.1 answer written straight to the socket, which is then closed."""
    body = message.encode()
    head = [f"HTTP/1.1 {status}", "content-type: text/plain; charset=utf-8", *extra, "connection: close"]
    head.append(f"content-length: {len(body)}")
    if not transport.is_closing():
        transport.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
    transport.close()


def protocol(settings: Settings) -> type[HttpToolsProtocol]:
    """uvicorn's HTTP protocol with `settings`' header deadline and per-client connection cap."""
    header_timeout_s = settings.header_timeout_s
    cap = settings.max_connections_per_client
    open_by_client: Counter[str] = Counter()

    class Guarded(HttpToolsProtocol):
        """One per connection, as uvicorn makes them."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._host: str | None = None
            self._header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            host = self.client[0] if self.client else None
            if host is not None and open_by_client[host] >= cap:
                _answer(
                    transport,
                    "429 Too Many Requests",
                    f"{host} holds {open_by_client[host]} open connections, the most one client may "
                    f"(KVCANARY_MAX_CONNECTIONS_PER_CLIENT={cap}); close some and retry",
                    f"retry-after: {RETRY_AFTER_S}",
                )
                return
            if host is not None:
                self._host = host
                open_by_client[host] += 1
            self._start_header_clock()

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_header_clock()
            if self._host is not None:
                open_by_client[self._host] -= 1
                if open_by_client[self._host] <= 0:
                    del open_by_client[self._host]
                self._host = None
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._start_header_clock()  # the next request on a kept-alive connection

        def on_headers_complete(self) -> None:
            self._stop_header_clock()
            super().on_headers_complete()

        def _start_header_clock(self) -> None:
            if self._header_timer is None:
                self._header_timer = self.loop.call_later(header_timeout_s, self._headers_late)

        def _stop_header_clock(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_late(self) -> None:
            self._header_timer = None
            _answer(
                self.transport,
                "408 Request Timeout",
                f"the request's headers did not arrive within {header_timeout_s:g} s "
                "(KVCANARY_HEADER_TIMEOUT_S); send the whole request at once",
            )

    return Guarded
