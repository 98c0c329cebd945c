"""POST one JSON body to one webhook, retrying with exponential backoff.

Connection errors, timeouts, 408, 429 and 5xx are worth another try; any other 4xx means
the receiver refuses this message and retrying cannot help.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

TIMEOUT_S = 10.0
RETRYABLE_STATUS = frozenset({408, 429})


@dataclass(frozen=True)
class Delivery:
    ok: bool
    attempts: int
    detail: str


def describe(url: str) -> str:
    """Scheme and host only: Slack-style webhook URLs carry their secret in the path."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"


def post(
    url: str, body: dict[str, Any], *, attempts: int, backoff_s: float, stop: threading.Event | None = None
) -> Delivery:
    """Try up to `attempts` times, waiting backoff_s, 2*backoff_s, ... between tries."""
    stop = stop or threading.Event()
    detail = "not attempted"
    with httpx.Client(timeout=TIMEOUT_S, follow_redirects=False) as client:
        for attempt in range(1, attempts + 1):
            try:
                response = client.post(url, json=body)
            except httpx.HTTPError as exc:
                detail = f"{type(exc).__name__}: {exc}"
            else:
                if response.is_success:
                    return Delivery(True, attempt, f"HTTP {response.status_code}")
                detail = f"HTTP {response.status_code}: {response.text[:200]}"
                if response.status_code < 500 and response.status_code not in RETRYABLE_STATUS:
                    return Delivery(False, attempt, detail)
            if attempt < attempts and stop.wait(backoff_s * 2 ** (attempt - 1)):
                return Delivery(False, attempt, f"{detail}; the service stopped before the next try")
    return Delivery(False, attempts, detail)
