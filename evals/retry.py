"""One retry rule for every HTTP call kvcanary repeats: the WER suite's transcription requests,
the drift suite's completions and the alert webhooks.

Worth another try: a transport error (refused or reset connection, a timeout), 408, 429 and
any 5xx; any other status is the receiver's final answer. A `Retry-After` header (seconds or
an HTTP date, read by `evals.retry_after`, which the CLI client shares) sets the wait before the
next try; otherwise the waits grow exponentially from `base_s` up to `cap_s`. tenacity runs the loop.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_attempt, wait_exponential

from evals.retry_after import retry_after_s

RETRY_STATUS = frozenset({408, 429})


class RetryableStatus(Exception):
    """A response worth another try; `check` raises it so that tenacity sees a failed attempt."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        super().__init__(f"HTTP {response.status_code}: {response.text[:300]}")


def check(response: httpx.Response) -> httpx.Response:
    """Raise RetryableStatus for 408, 429 and 5xx; return any other response as it is."""
    if response.status_code in RETRY_STATUS or response.status_code >= 500:
        raise RetryableStatus(response)
    return response


class _Wait:
    """The server's `Retry-After` where it gave one, else exponential backoff."""

    def __init__(self, base_s: float, cap_s: float) -> None:
        self.backoff = wait_exponential(multiplier=base_s, max=cap_s)

    def __call__(self, state: RetryCallState) -> float:
        failure = state.outcome.exception() if state.outcome is not None else None
        if isinstance(failure, RetryableStatus):
            asked = retry_after_s(failure.response.headers.get("retry-after"))
            if asked is not None:
                return asked
        return float(self.backoff(state))


def policy(attempts: int, base_s: float, cap_s: float) -> dict[str, Any]:
    """Keyword arguments for tenacity's `Retrying`/`AsyncRetrying`: at most `attempts` tries.

    The last failure is raised as it is (an httpx error or RetryableStatus), not as RetryError.
    """
    return {
        "stop": stop_after_attempt(attempts),
        "retry": retry_if_exception_type((httpx.TransportError, RetryableStatus)),
        "wait": _Wait(base_s, cap_s),
        "reraise": True,
    }


async def send(
    request: Callable[[], Awaitable[httpx.Response]],
    attempts: int,
    base_s: float,
    cap_s: float,
    before_each: Callable[[], None] = lambda: None,
) -> tuple[httpx.Response | None, str, int]:
    """`request` tried by the rule: (the final response, "", tries), or (None, the last
    failure, tries) when every try failed. The response may be any status that is not worth
    another try; the caller reads it. `before_each` runs before every try (it may raise to
    stop, as a suite does when its run is stopped)."""
    tries = 0

    async def attempt() -> httpx.Response:
        nonlocal tries
        before_each()
        tries += 1
        return check(await request())

    try:
        response: httpx.Response = await AsyncRetrying(**policy(attempts, base_s, cap_s))(attempt)
    except RetryableStatus as exc:
        return None, str(exc), tries
    except httpx.HTTPError as exc:
        return None, f"{type(exc).__name__}: {exc}", tries
    return response, "", tries
