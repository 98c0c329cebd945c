"""The `kvcanary` command: serve, run here, submit from CI, tokens, baselines, database.

`submit` is all a CI job needs, and `pip install kvcanary` without extras gives only its
dependencies: the commands that act on a database or start an engine import the server's
modules inside themselves.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import httpx
import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from evals.retry_after import retry_after_s
from service.durations import EXAMPLES, parse_duration
from service.report import cli_console, print_run, write_junit
from service.roles import Role
from service.runs.cli import app as runs_app
from service.runs.state import FINAL
from service.scheduling.cli import app as schedules_app
from service.schemas import RunDetail, check_labels, parse_label_pairs

if TYPE_CHECKING:
    from service.profile_catalog import Catalog
    from service.profiles import Expectation
    from service.runs.mutation import MutationMatrix

app = typer.Typer(help="kvcanary: end-to-end accuracy gate for vLLM attention kernels", no_args_is_help=True)
db_app = typer.Typer(help="Database schema", no_args_is_help=True)
tokens_app = typer.Typer(help="API tokens", no_args_is_help=True)
baselines_app = typer.Typer(help="Baselines and reference runs", no_args_is_help=True)
profiles_app = typer.Typer(help="Profiles, including vLLM lm-eval configs read as profiles", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(tokens_app, name="tokens")
app.add_typer(baselines_app, name="baselines")
app.add_typer(profiles_app, name="profiles")
app.add_typer(schedules_app, name="schedules")
app.add_typer(runs_app, name="runs")

console = cli_console()
EXIT_PASS, EXIT_REGRESSION, EXIT_ERROR = 0, 1, 2


def _labels(pairs: list[str]) -> dict[str, str]:
    """`--label` options as the API checks them: NUL, a lone surrogate (a non-UTF-8 argv byte) and
    bad keys are refused here, for `run` (which stores them directly) as for `submit`."""
    try:
        return check_labels(parse_label_pairs(pairs))
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc


COMPARE_HELP = (
    "Arms on the same prompts, control first; repeatable. A word without '=' is a variant and starts an "
    "arm, key=value words override that arm's engine: 'stock,fixed', or "
    "'--compare fixed --compare fixed,max_num_batched_tokens=64'"
)
EXPECT_HELP = "ARM=pass or ARM=fail, repeatable: what each arm must do; the exit code then says whether it did"


def _compare(values: list[str]) -> list[str]:
    from service.arms import parse_compare

    try:
        return parse_compare(values)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc


def _expect(values: list[str]) -> dict[str, Expectation]:
    from service.arms import parse_expect

    try:
        return parse_expect(values)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc


def _expiry(expires_in: str | None, expires: datetime | None) -> datetime | None:
    """`--expires-in 90d` (d, h or m) or `--expires 2027-01-31`, as a UTC instant."""
    if expires_in and expires:
        raise typer.BadParameter("give --expires-in or --expires, not both")
    if expires is not None:
        return expires if expires.tzinfo else expires.replace(tzinfo=UTC)
    if not expires_in:
        return None
    try:
        return datetime.now(UTC) + parse_duration(expires_in, "--expires-in")
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc


def _exit_code(run: RunDetail) -> int:
    """0 pass, 1 regression, 2 error; with expectations, 0 as expected and 1 unexpected (2 stays error)."""
    if run.expect and run.status in ("passed", "failed"):
        return EXIT_PASS if run.outcome == "as_expected" else EXIT_REGRESSION
    if run.status == "passed":
        return EXIT_PASS
    if run.status == "failed":
        return EXIT_REGRESSION
    return EXIT_ERROR


def _prepared_db() -> str:
    from service.db.migrate import upgrade
    from service.settings import get_settings

    settings = get_settings()
    url = settings.resolved_database_url()
    upgrade(url)
    return url


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Bind address (KVCANARY_HOST)")] = None,
    port: Annotated[int | None, typer.Option(help="Port (KVCANARY_PORT)")] = None,
) -> None:
    """Start the API, dashboard and local worker; migrations are applied on start."""
    import uvicorn

    from service.app import create_app
    from service.private_files import keep_private
    from service.settings import get_settings

    keep_private()  # run folders, logs and the database are the service user's alone
    settings = get_settings()
    uvicorn.run(create_app(settings), host=host or settings.host, port=port or settings.port, log_level="info")


@db_app.command("upgrade")
def db_upgrade() -> None:
    """Apply all migrations to the configured database."""
    console.print(f"database at {_prepared_db()} is up to date")


@tokens_app.command("create")
def tokens_create(
    role: Annotated[Role, typer.Option(help="viewer reads; ci also triggers runs; admin also edits baselines")],
    name: Annotated[
        str | None, typer.Option(help="Who or what holds it, e.g. github-actions; unique (default: role-<random>)")
    ] = None,
    expires_in: Annotated[str | None, typer.Option(help=f"Lifetime, e.g. {EXAMPLES}")] = None,
    expires: Annotated[
        datetime | None, typer.Option(help="Expiry date or time (UTC unless given), e.g. 2027-01-31")
    ] = None,
) -> None:
    """Print a new API token once; only its hash is stored."""
    import secrets

    from service.auth import TokenRefused, create_token
    from service.db.session import session_scope

    expires_at = _expiry(expires_in, expires)
    name = name or f"{role.value}-{secrets.token_hex(3)}"
    try:
        with session_scope(_prepared_db()) as session:
            token = create_token(session, name, role, expires_at)
    except TokenRefused as exc:
        raise typer.BadParameter(str(exc)) from exc
    until = f", valid until {expires_at:%Y-%m-%d %H:%M} UTC" if expires_at else ""
    console.print(f"created {role.value} token {name!r}{until}; store it now, it is not shown again:")
    print(token)


@tokens_app.command("list")
def tokens_list() -> None:
    """Every token: id, name, role, state, expiry and last use (never the secret)."""
    from service.auth import list_tokens
    from service.db.models import utcnow
    from service.db.session import session_scope

    now = utcnow()
    with session_scope(_prepared_db(), write=False) as session:
        rows = list_tokens(session)
    for row in rows:
        state = "revoked" if row.revoked else "expired" if row.expires_at and row.expires_at <= now else "active"
        expiry = f"{row.expires_at:%Y-%m-%d %H:%M}" if row.expires_at else "never"
        used = f"{row.last_used_at:%Y-%m-%d %H:%M}" if row.last_used_at else "never"
        print(f"{row.id}\t{row.name}\t{row.role}\t{state}\texpires {expiry}\tlast used {used}")


@tokens_app.command("revoke")
def tokens_revoke(token_id: Annotated[int, typer.Argument(help="The id `kvcanary tokens list` shows")]) -> None:
    """Revoke a token; the next request that presents it gets 401."""
    from service.auth import revoke
    from service.db.session import session_scope

    with session_scope(_prepared_db()) as session:
        row = revoke(session, token_id)
    if row is None:
        console.print(f"[red]no token with id {token_id}; see `kvcanary tokens list`[/red]")
        raise typer.Exit(EXIT_ERROR)
    console.print(f"revoked token {token_id} ({row.name}, {row.role})")


def _catalog() -> Catalog:
    from service.profile_catalog import load_catalog
    from service.profiles import ProfileError
    from service.settings import get_settings

    try:
        return load_catalog(get_settings())
    except ProfileError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(EXIT_ERROR) from exc


@profiles_app.command("list")
def profiles_list() -> None:
    """Every profile by name and where it comes from; vLLM files left out, with the reason."""
    catalog = _catalog()
    for name, profile in sorted(catalog.profiles.items()):
        origin = f"vLLM config {catalog.vllm[name].path}" if name in catalog.vllm else "kvcanary profile"
        typer.echo(f"{name}: {profile.model} ({origin})")
    for problem in catalog.problems:
        typer.echo(f"note: {problem}")


@profiles_app.command("show")
def profiles_show(name: str) -> None:
    """How a profile was understood: for a vLLM config, where each key went and what was not applied."""
    catalog = _catalog()
    key = name.lower()
    if key not in catalog.profiles:
        console.print(f"[red]unknown profile {name!r}; known profiles: {', '.join(sorted(catalog.profiles))}[/red]")
        raise typer.Exit(EXIT_ERROR)
    vllm = catalog.vllm.get(key)
    if vllm is not None:
        typer.echo(f"source: vLLM lm-eval config {vllm.path}")
        for source_key, target in vllm.understood:
            typer.echo(f"  {source_key} -> {target}")
        for note in vllm.notes:
            typer.echo(f"  {note.key}: {note.reason}")
    import yaml

    dumped = catalog.profiles[key].model_dump(mode="json", exclude_defaults=False)
    typer.echo(yaml.safe_dump(dumped, sort_keys=False))


@baselines_app.command("list")
def baselines_list(profile: Annotated[str | None, typer.Argument()] = None) -> None:
    from service import baselines
    from service.db.session import session_scope

    with session_scope(_prepared_db()) as session:
        for b in baselines.list_baselines(session, profile):
            console.print(
                f"{b.profile} {b.suite}.{b.metric}: {b.value} ({b.direction}, {b.tolerance_kind} {b.tolerance}) "
                f"reference run {b.reference_run_id or '-'} — {b.source}"
            )


@baselines_app.command("promote")
def baselines_promote(
    run_id: int, by: Annotated[str, typer.Option(help="Recorded in the history")] = os.environ.get("USER", "cli")
) -> None:
    """Make a finished run the paired reference for every metric it reported."""
    from service import baselines
    from service.db.session import session_scope
    from service.profile_catalog import configured_profiles
    from service.settings import get_settings

    settings = get_settings()
    profiles = configured_profiles(settings)
    with session_scope(_prepared_db()) as session:
        try:
            changed = baselines.promote(session, run_id, by, profiles)
        except baselines.BaselineError as exc:
            console.print(f"[red]{exc}[/red]")
            raise typer.Exit(EXIT_ERROR) from exc
    for b in changed:
        console.print(f"{b.profile} {b.suite}.{b.metric}: reference run is now {b.reference_run_id}")


@app.command()
def run(
    profile: str,
    limit: Annotated[int | None, typer.Option(help="Cap every suite at this many items")] = None,
    variant: Annotated[str | None, typer.Option(help="Kernel variant: fixed, legacy, stock or a mutant")] = None,
    label: Annotated[list[str] | None, typer.Option(help="key=value, repeatable")] = None,
    junit: Annotated[Path | None, typer.Option(help="Write a JUnit XML report here")] = None,
    compare: Annotated[list[str] | None, typer.Option(help=COMPARE_HELP)] = None,
    expect: Annotated[list[str] | None, typer.Option(help=EXPECT_HELP)] = None,
) -> None:
    """Run one profile here, without the service: engine, suites, verdict, a result table."""
    from service import baselines
    from service.db.models import Run
    from service.db.session import session_scope
    from service.private_files import keep_private
    from service.profile_catalog import configured_profiles
    from service.profiles import ArmSpec, ProfileError, RunOverrides
    from service.runs import pipeline, queries, queue
    from service.runs.admission import admit
    from service.runs.worker import new_worker_id
    from service.settings import get_settings

    labels = _labels(label or [])
    keep_private()
    settings = get_settings()
    url = _prepared_db()
    try:
        profiles = configured_profiles(settings)
    except ProfileError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(EXIT_ERROR) from exc
    if profile not in profiles:
        console.print(f"[red]unknown profile {profile!r}; known profiles: {', '.join(sorted(profiles))}[/red]")
        raise typer.Exit(EXIT_ERROR)
    try:
        overrides = RunOverrides.model_validate({"limit": limit, "kernel_variant": variant})
        arms = [ArmSpec.model_validate(name) for name in _compare(compare)] if compare else None
        admitted = admit(profiles[profile], overrides, arms, _expect(expect) if expect else None, on_this_host=True)
    except ValueError as exc:  # RunRefused, and the options' own validation errors
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(EXIT_ERROR) from exc
    worker_id = new_worker_id()
    with session_scope(url) as session:
        baselines.seed_from_profiles(session, profiles)
        queued, _ = queue.enqueue(
            session,
            profile=profile,
            trigger="manual",
            triggered_by=os.environ.get("USER", "cli"),
            labels=labels,
            overrides=overrides.model_dump(exclude_none=True),
            arms=admitted.plan.stored_arms(),
            expect=admitted.plan.expect,
            max_attempts=1,
            profile_snapshot=admitted.snapshot(),
        )
        session.flush()
        run_id = queued.id
        queue.claim_next(session, worker_id, run_id)
    console.print(f"run {run_id}: profile {profile}, folder {settings.runs_dir() / str(run_id)}")
    worker = threading.Thread(target=pipeline.run_claimed, args=(run_id, settings, profiles, worker_id), daemon=True)
    worker.start()
    _follow(url, run_id, worker)
    with session_scope(url) as session:
        row = session.get(Run, run_id)
        assert row is not None
        detail = queries.run_detail(session, row)
    print_run(detail, console)
    if junit:
        write_junit(detail, junit)
    raise typer.Exit(_exit_code(detail))


def _follow(url: str, run_id: int, worker: threading.Thread) -> None:
    """A progress bar fed from the run row, which is what the service and dashboard read too."""
    from service.db.models import Run
    from service.db.session import session_scope

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task("queued", total=None)
        while worker.is_alive():
            with session_scope(url) as session:
                row = session.get(Run, run_id)
                assert row is not None
                phase = row.progress_phase or row.status
                bar.update(
                    task,
                    description=f"{row.status}: {phase}",
                    completed=row.progress_done,
                    total=row.progress_total or None,
                )
            worker.join(0.5)


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


@app.command()
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
    body: dict[str, object] = {"profile": profile, "labels": _labels(label or [])}
    overrides = {"limit": limit, "kernel_variant": variant, "canaries": canary or None}
    if any(value is not None for value in overrides.values()):
        body["overrides"] = {key: value for key, value in overrides.items() if value is not None}
    if compare:
        body["compare"] = _compare(compare)
    if expect:
        body["expect"] = _expect(expect)
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
    raise typer.Exit(_exit_code(detail))


EXIT_INCOMPLETE = 3
RELEASE_EXIT = {"ready": EXIT_PASS, "blocked": EXIT_REGRESSION, "incomplete": EXIT_INCOMPLETE}


@app.command("release-report")
def release_report(
    release: Annotated[str, typer.Argument(help="KEY=VALUE, e.g. vllm_version=0.25.1 or git_sha=3f2a9c1")],
    url: Annotated[str, typer.Option(envvar="KVCANARY_URL", help="Base URL of a kvcanary service")],
    previous: Annotated[
        str | None, typer.Option(help="The release to compare with, a value of the same key (default: the one before)")
    ] = None,
    format_: Annotated[
        Literal["markdown", "json"], typer.Option("--format", help="markdown for release notes, or the JSON document")
    ] = "markdown",
    token: Annotated[str | None, typer.Option(envvar="KVCANARY_TOKEN", help="API token (any role)")] = None,
) -> None:
    """Print a release's summary from a service: ready, blocked or incomplete, and a table per profile.
    Exit 0 ready, 1 blocked, 3 incomplete, 2 when there is no such release or the service cannot answer."""
    from urllib.parse import quote

    from service.releases.markdown import release_markdown
    from service.releases.schemas import ReleaseSummary

    key, sep, _ = release.partition("=")
    if not sep or not key:
        raise typer.BadParameter(f"{release!r} must be KEY=VALUE, e.g. vllm_version=0.25.1")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    params = {"previous": previous} if previous is not None else {}
    try:
        with httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=60) as client:
            response = client.get(f"/api/v1/releases/{quote(release, safe='=')}", params=params)
    except httpx.HTTPError as exc:
        console.print(f"[red]service at {url} unreachable: {exc}[/red]", markup=True)
        raise typer.Exit(EXIT_ERROR) from exc
    if response.status_code != 200:
        is_json = "json" in response.headers.get("content-type", "")
        detail = response.json().get("detail", response.text) if is_json else response.text
        typer.echo(f"{response.status_code}: {detail}", err=True)
        raise typer.Exit(EXIT_ERROR)
    summary = ReleaseSummary.model_validate(response.json())
    if format_ == "json":
        typer.echo(summary.model_dump_json(indent=2))
    else:
        typer.echo(release_markdown(summary), nl=False)
    raise typer.Exit(RELEASE_EXIT[summary.state])


@app.command()
def mutants(
    profile: Annotated[list[str], typer.Argument(help="Profiles, e.g. drift-tiny-gpu gsm8k-tiny-gpu")],
    mutant: Annotated[
        list[str] | None, typer.Option(help="Only this mutant (repeatable); default: the whole catalogue")
    ] = None,
    url: Annotated[str | None, typer.Option(help="Queue on this kvcanary service instead of running here")] = None,
    token: Annotated[str | None, typer.Option(envvar="KVCANARY_TOKEN", help="API token (ci role), with --url")] = None,
    label: Annotated[list[str] | None, typer.Option(help="key=value, repeatable")] = None,
    show: Annotated[bool, typer.Option(help="Print the latest stored matrix; queue nothing")] = False,
    timeout: Annotated[float, typer.Option(min=0, help="With --url: seconds to wait for every run")] = 6 * 3600,
    poll: Annotated[float, typer.Option(min=0.1, help="With --url: seconds between status polls")] = 5.0,
) -> None:
    """The mutation matrix: fixed vs each kernel mutant (kernels.mutants) on the profiles' suites,
    through the queue; prints mutant x suite (caught? at how many items? how long?). Exit 0 when
    every run ended, 2 when one errored or the service failed."""
    from kernels.mutants import MUTANTS
    from service.runs import mutation_batch
    from service.runs.mutation import MutationMatrix, markdown, new_batch_id

    unknown = [m for m in mutant or [] if m not in MUTANTS]
    if unknown:
        raise typer.BadParameter(f"unknown mutant {', '.join(unknown)}; mutants: {', '.join(MUTANTS)}")
    chosen = list(mutant or MUTANTS)
    batch, labels = new_batch_id(), _labels(label or [])
    if url is not None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            with httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=60) as client:
                if show:
                    got = [client.get(f"/api/v1/profiles/{p}/mutants").raise_for_status().json() for p in profile]
                    matrices = [MutationMatrix.model_validate(m) for m in got]
                else:
                    matrices = mutation_batch.run_remote(client, profile, chosen, batch, labels, timeout, poll)
        except (httpx.HTTPError, RuntimeError, TimeoutError) as exc:
            console.print(f"[red]service at {url}: {exc}[/red]")
            raise typer.Exit(EXIT_ERROR) from exc
    else:
        matrices = _mutants_here(profile, chosen, batch, labels, show)
    print(markdown(matrices))
    errored = [r.mutant for m in matrices for r in m.rows if any(c.state == "error" for c in r.cells.values())]
    raise typer.Exit(EXIT_ERROR if errored else EXIT_PASS)


def _mutants_here(
    names: list[str], chosen: list[str], batch: str, labels: dict[str, str], show: bool
) -> list[MutationMatrix]:
    from service.db.session import session_scope
    from service.profile_catalog import configured_profiles
    from service.profiles import ProfileError
    from service.runs import mutation_batch
    from service.runs.admission import RunRefused, fitted
    from service.runs.mutation import latest_matrix
    from service.settings import get_settings

    settings = get_settings()
    try:
        profiles = configured_profiles(settings)
    except ProfileError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(EXIT_ERROR) from exc
    missing = [name for name in names if name not in profiles]
    if missing:
        console.print(f"[red]unknown profile {', '.join(missing)}; known profiles: {', '.join(sorted(profiles))}[/red]")
        raise typer.Exit(EXIT_ERROR)
    selected = [profiles[name] for name in names]
    if show:
        with session_scope(_prepared_db(), write=False) as session:
            return [latest_matrix(session, p.name, [e.suite for e in p.suites]) for p in selected]
    try:
        for chosen_profile in selected:
            fitted(chosen_profile, on_this_host=True)
    except RunRefused as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(EXIT_ERROR) from exc
    by = os.environ.get("USER", "cli")
    return mutation_batch.run_here(settings, profiles, selected, chosen, batch, labels, by, console.print)
