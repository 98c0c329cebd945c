"""Templates and the few formatting rules every page shares (times in UTC, durations, numbers)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from fastapi import Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates

from evals import kinds
from evals.numbers import DECIMALS, format_number, format_signed
from service.api.deps import ANONYMOUS, COOKIE, Caller, csrf_token
from service.dashboard.assets import PLOTLY_URL
from service.releases.schemas import release_path
from service.runs.state import ACTIVE, Status

HERE = Path(__file__).resolve().parent
STATIC_DIR = HERE / "static"

# Statuses whose progress the pages follow live; queued runs wait for a worker.
LIVE = frozenset(s.value for s in ACTIVE) | {Status.QUEUED.value}


def when(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M UTC") if value else "—"


def duration(seconds: float | None) -> str:
    """`1h 02m`, `3m 07s`, `12s`: the two leading units are all a reader compares."""
    if seconds is None:
        return "—"
    total = round(seconds)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"


def since(value: datetime | None) -> str:
    """Wall time from `value` to now, for a run still going."""
    return f"{duration((datetime.now(UTC) - value).total_seconds())} so far" if value else "—"


def number(value: float | int | None, digits: int = DECIMALS) -> str:
    """Numbers as every report writes them (`evals.numbers`), a dash where there is none."""
    return format_number(value, digits, missing="—")


def is_link(value: str) -> bool:
    return value.startswith(("https://", "http://"))


def with_query(request: Request, **changes: Any) -> str:
    """This page's URL with some query parameters replaced; empty ones are dropped."""
    params = {**dict(request.query_params), **{key: str(value) for key, value in changes.items()}}
    return f"{request.url.path}?{urlencode({k: v for k, v in params.items() if v != ''})}"


def question_of(prompt: str) -> str:
    """The item's own question: a few-shot prompt ends with it, after its worked examples."""
    _, marker, tail = prompt.rpartition("Question:")
    question = tail if marker else prompt[-600:]
    return question.strip().removesuffix("Answer:").strip()


def _templates() -> Jinja2Templates:
    templates = Jinja2Templates(directory=HERE / "templates")
    env = templates.env
    env.filters.update(
        when=when,
        duration=duration,
        since=since,
        number=number,
        signed=format_signed,
        question=question_of,
    )
    for kind in kinds.registry().values():  # what a kind's own partials (samples/<kind>.html) use
        env.filters.update(kind.filters)
    env.tests["link"] = is_link
    env.globals.update(
        with_query=with_query, LIVE=LIVE, PLOTLY_URL=PLOTLY_URL, ANONYMOUS=ANONYMOUS, release_path=release_path
    )
    return templates


TEMPLATES = _templates()


def page(request: Request, template: str, caller: Caller, status_code: int = 200, **context: Any) -> HTMLResponse:
    """Render a page with what the layout needs: who is reading and whether reads need a login."""
    settings = request.app.state.settings
    cookie = request.cookies.get(COOKIE)
    csrf = csrf_token(cookie) if cookie else ""
    return TEMPLATES.TemplateResponse(
        request,
        template,
        {"caller": caller, "read_auth": settings.read_auth, "csrf": csrf, **context},
        status_code=status_code,
    )
