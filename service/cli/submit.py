"""`kvcanary submit`: queue a run on a service from CI and, with `--wait`, report its verdict.

All a CI job needs, from a bare `pip install kvcanary`: nothing here imports the server's
packages. The service may restart or be busy while a job waits, so every request goes
through `_answer`, which waits as long as the options allow.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import httpx
import typer

from evals.retry_after import retry_after_s
from service.cli.common import (
    COMPARE_HELP,
    EXIT_ERROR,
    EXIT_PASS,
    EXPECT_HELP,
    FRESH_ENGINES_HELP,
    checked_labels,
    compare_arms,
    console,
    exit_code,
    expectations,
)
from service.report import print_run, write_junit
from service.runs.state import FINAL
from service.schemas import RunDetail

# A busy service's wait when it names none (a proxy's 429).
BUSY_PAUSE_S = 5.0
# What a service that is restarting, or a proxy in front of it, answers for a while (the
# service's own 503 names a Retry-After: it is busy, and says when to come back).
RESTARTING = (502, 503, 504)
# A service that is down or restarting; a URL the client cannot use at all is not retried.
UNANSWERED = (httpx.NetworkError, httpx.TimeoutException, httpx.RemoteProtocolError)


class _Silence:
    """How long a service has not answered, against the limits on waiting for it."""

    def __init__(self, poll: float, give_up_s: float, deadline: float) -> None:
        self.poll, self.give_up_s, self.deadline = poll, give_up_s, deadline
        self.since: float | None = None

    def answered(self) -> None:
        self.since = None

    def __str__(self) -> str:
        silent = time.monotonic() - self.since if self.since is not None else 0.0
        return f"did not answer for {silent:.0f} s"

    def wait(self, why: str) -> bool:
        """Sleep one poll (no later than either limit) and say True, or False once a limit is reached."""
        now = time.monotonic()
        self.since = now if self.since is None else self.since
        left = min(self.since + self.give_up_s, self.deadline) - now
        if left <= 0:
            return False
        pause = min(self.poll, left)
        print(f"service not answering ({why}); asking again in {pause:.1f} s", file=sys.stderr)
        time.sleep(pause)
        return True


def _answer(send: Callable[[], httpx.Response], silence: _Silence) -> httpx.Response | None:
    """What `send()` gets once the service answers. While it is busy (429, or 503 with a
    Retry-After in seconds or as a date, read by `evals.retry_after`), wait what it names and
    send again until the deadline (then its busy answer is returned); while it does not answer
    (refused, timed out, 502-504 from a proxy: a restart, which runs survive), send again every
    poll until a limit, None after that. A POST carries the call's Idempotency-Key, so one that
    reached the service before its answer was lost queues nothing twice."""
    while True:
        try:
            response = send()
        except UNANSWERED as exc:
            why = type(exc).__name__
        else:
            asked = retry_after_s(response.headers.get("Retry-After"))
            busy = response.status_code == 429 or (response.status_code == 503 and asked is not None)
            if not busy and response.status_code not in RESTARTING:
                silence.answered()
                return response
            if busy:
                silence.answered()
                left = silence.deadline - time.monotonic()
                if left <= 0:
                    return response
                pause = min(BUSY_PAUSE_S if asked is None else asked, left)
                print(f"service busy ({response.status_code}); retrying in {pause:.1f} s", file=sys.stderr)
                time.sleep(pause)
                continue
            why = f"HTTP {response.status_code}"
        if not silence.wait(why):
            return None


def submit(
    url: Annotated[str, typer.Option(help="Base URL of a kvcanary service")],
    profile: Annotated[str, typer.Option(help="Profile to run")],
    label: Annotated[list[str] | None, typer.Option(help="key=value, repeatable (git_sha, vllm_version, ...)")] = None,
    limit: Annotated[int | None, typer.Option(help="Cap every suite at this many items")] = None,
    variant: Annotated[str | None, typer.Option(help="Kernel variant: fixed, legacy, stock or a mutant")] = None,
    canary: Annotated[
        list[str] | None, typer.Option(help="Arm a canary (nan_kv_tail, high_block_ids); repeatable")
    ] = None,
    compare: Annotated[list[str] | None, typer.Option(help=COMPARE_HELP)] = None,
    expect: Annotated[list[str] | None, typer.Option(help=EXPECT_HELP)] = None,
    fresh_engines: Annotated[bool, typer.Option(help=FRESH_ENGINES_HELP)] = False,
    wait: Annotated[bool, typer.Option(help="Wait for the verdict; the exit code then says pass/fail")] = False,
    junit: Annotated[Path | None, typer.Option(help="With --wait: write a JUnit XML report here")] = None,
    token: Annotated[str | None, typer.Option(envvar="KVCANARY_TOKEN", help="API token (ci role)")] = None,
    idempotency_key: Annotated[
        str | None, typer.Option(help="Resubmits return the same run (default: one made for this call)")
    ] = None,
    timeout: Annotated[
        float, typer.Option(min=0, help="Seconds to wait for the service to take the run, and for the verdict")
    ] = 6 * 3600,
    poll: Annotated[
        float, typer.Option(min=0.1, help="Seconds between status polls and between tries of a silent service")
    ] = 5.0,
    unreachable_timeout: Annotated[
        float,
        typer.Option(min=0, help="Seconds the service may not answer (a restart) before giving up"),
    ] = 600.0,
) -> None:
    """Queue a run on a service (for CI). Exit 0 pass, 1 regression, 2 error or unreachable service;
    with --expect, 0 when every arm did what was expected and 1 when one did not."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    # Its own key lets this call ask again after a lost answer without queueing twice.
    headers["Idempotency-Key"] = idempotency_key or f"kvcanary-submit-{uuid.uuid4()}"
    body: dict[str, object] = {"profile": profile, "labels": checked_labels(label or [])}
    overrides = {
        "limit": limit,
        "kernel_variant": variant,
        "canaries": canary or None,
        "arm_engines": "fresh" if fresh_engines else None,
    }
    if any(value is not None for value in overrides.values()):
        body["overrides"] = {key: value for key, value in overrides.items() if value is not None}
    if compare:
        body["compare"] = compare_arms(compare)
    if expect:
        body["expect"] = expectations(expect)
    try:
        with httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=30) as client:
            silence = _Silence(poll, unreachable_timeout, time.monotonic() + timeout)
            response = _answer(lambda: client.post("/api/v1/runs", json=body), silence)
            if response is None:
                console.print(f"[red]service at {url} {silence}; no run id came back[/red]")
                raise typer.Exit(EXIT_ERROR)
            if response.status_code >= 400:
                console.print(f"[red]{response.status_code}: {response.text}[/red]")
                raise typer.Exit(EXIT_ERROR)
            detail = RunDetail.model_validate(response.json())
            console.print(f"run {detail.id} queued: {detail.links['self']}")
            if not wait:
                raise typer.Exit(EXIT_PASS)
            silence = _Silence(poll, unreachable_timeout, time.monotonic() + timeout)
            status_path = f"/api/v1/runs/{detail.id}"
            while detail.status not in {s.value for s in FINAL}:
                left = silence.deadline - time.monotonic()
                if left <= 0:
                    console.print(f"[red]no verdict after {timeout:g} s; run {detail.id} is {detail.status}[/red]")
                    raise typer.Exit(EXIT_ERROR)
                time.sleep(min(poll, left))
                polled = _answer(lambda: client.get(status_path), silence)
                if polled is None:
                    console.print(f"[red]service at {url} {silence}; run {detail.id} was {detail.status}[/red]")
                    raise typer.Exit(EXIT_ERROR)
                detail = RunDetail.model_validate(polled.raise_for_status().json())
                done, total = detail.progress.done, detail.progress.total
                print(f"run {detail.id}: {detail.status} {detail.progress.phase} {done}/{total}", file=sys.stderr)
    except httpx.HTTPError as exc:
        console.print(f"[red]service at {url} unreachable or failing: {exc}[/red]")
        raise typer.Exit(EXIT_ERROR) from exc
    print_run(detail, console)
    if junit:
        write_junit(detail, junit)
    raise typer.Exit(exit_code(detail))
