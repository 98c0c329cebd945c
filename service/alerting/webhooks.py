"""POST one JSON body to one webhook, retrying by the project's one rule (evals.retry).

Connection errors, timeouts, 408, 429 and 5xx are worth another try (after the receiver's
Retry-After, if it sent one); any other 4xx means the receiver refuses this message and
retrying cannot help.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
from tenacity import Retrying

from evals import retry

TIMEOUT_S = 10.0
BACKOFF_CAP_S = 300.0


@dataclass(frozen=True)
class Delivery:
    ok: bool
    attempts: int
    detail: str


def describe(url: str) -> str:
    """Scheme and host only: Slack-style webhook URLs carry their secret in the path."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"


class _Stopped(Exception):
    """The service is stopping: no further try."""


def post(
    url: str, body: dict[str, Any], *, attempts: int, backoff_s: float, stop: threading.Event | None = None
) -> Delivery:
    """Try up to `attempts` times, waiting backoff_s, 2*backoff_s, ... (or Retry-After) between tries."""
    stop = stop or threading.Event()
    tries, detail = 0, "not attempted"

    def send(client: httpx.Client) -> httpx.Response:
        nonlocal tries, detail
        tries += 1
        try:
            response = client.post(url, json=body)
        except httpx.HTTPError as exc:
            detail = f"{type(exc).__name__}: {exc}"
            raise
        detail = f"HTTP {response.status_code}: {response.text[:200]}"
        return retry.check(response)

    def pause(seconds: float) -> None:
        if stop.wait(seconds):
            raise _Stopped

    retrying = Retrying(**retry.policy(attempts, backoff_s, BACKOFF_CAP_S), sleep=pause)
    with httpx.Client(timeout=TIMEOUT_S, follow_redirects=False) as client:
        try:
            response = retrying(send, client)
        except _Stopped:
            return Delivery(False, tries, f"{detail}; the service stopped before the next try")
        except (httpx.HTTPError, retry.RetryableStatus):
            return Delivery(False, tries, detail)
    if response.is_success:
        return Delivery(True, tries, f"HTTP {response.status_code}")
    return Delivery(False, tries, detail)
