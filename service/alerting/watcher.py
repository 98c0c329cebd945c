"""The alert watcher: a thread that finds newly finished runs and sends the alerts they warrant.

It reads finished runs instead of being called from the pipeline, so the run state machine
stays the one place that changes a run's status, runs that end outside the pipeline (given
up after interruptions) are covered too, and a slow webhook never holds up a worker. Each
run is claimed by inserting its `AlertCheck` row first, so with several service processes
on one database a run is alerted at most once. Delivery results are run events; they never
touch the run's status or verdict.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from datetime import timedelta

from sqlalchemy import exists, select
from sqlalchemy.exc import IntegrityError

from service.alerting import webhooks
from service.alerting.messages import AlertMessage, compose
from service.db.models import AlertCheck, Run, RunEvent, utcnow
from service.db.session import session_scope
from service.runs.state import Status
from service.settings import Settings

log = logging.getLogger(__name__)

# Runs that finished longer ago than this are history, not news: never alerted.
WINDOW = timedelta(days=1)
CONSIDERED = (Status.PASSED.value, Status.FAILED.value, Status.ERROR.value)


def run_url(settings: Settings, run_id: int) -> str:
    base = settings.public_url or f"http://{settings.host}:{settings.port}"
    return f"{base.rstrip('/')}/runs/{run_id}"


def unchecked_runs(settings: Settings) -> list[int]:
    with session_scope(settings.resolved_database_url()) as session:
        return list(
            session.scalars(
                select(Run.id)
                .where(
                    Run.status.in_(CONSIDERED),
                    Run.finished_at >= utcnow() - WINDOW,
                    ~exists().where(AlertCheck.run_id == Run.id),
                )
                .order_by(Run.id)
            )
        )


def _claim(settings: Settings, run_id: int, checked_by: str) -> tuple[bool, AlertMessage | None]:
    """(claimed, the run's alert or None when it has nothing to say); not claimed: another process has it."""
    try:
        with session_scope(settings.resolved_database_url()) as session:
            check = AlertCheck(run_id=run_id, checked_by=checked_by, outcome="")
            session.add(check)
            session.flush()
            run = session.get(Run, run_id)
            assert run is not None, f"run {run_id} vanished"
            message = compose(session, run, run_url(settings, run_id))
            quiet = "no alert: passed with every verdict as before, or its arms did as expected"
            check.outcome = message.kind if message else quiet
            return True, message
    except IntegrityError:
        return False, None


def _targets(settings: Settings, message: AlertMessage) -> list[tuple[str, str, dict[str, object]]]:
    generic = message.model_dump(mode="json")
    slack = {"text": message.slack_text}
    return [("json", url, generic) for url in settings.alert_webhooks] + [
        ("slack", url, slack) for url in settings.alert_slack_webhooks
    ]


def alert_run(settings: Settings, run_id: int, checked_by: str, stop: threading.Event | None = None) -> bool:
    """Judge one finished run and deliver its alert to every webhook; False if another process had it."""
    claimed, message = _claim(settings, run_id, checked_by)
    if message is None:
        return claimed
    events = []
    for style, url, body in _targets(settings, message):
        where = f"{style} webhook {webhooks.describe(url)}"
        result = webhooks.post(
            url, body, attempts=settings.alert_attempts, backoff_s=settings.alert_backoff_s, stop=stop
        )
        if result.ok:
            events.append(RunEvent(run_id=run_id, kind="alert_sent", message=f"{message.kind} to {where}"))
        else:
            log.warning("alert for run %d to %s failed: %s", run_id, where, result.detail)
            events.append(
                RunEvent(
                    run_id=run_id,
                    kind="alert_failed",
                    message=f"{message.kind} to {where} failed after {result.attempts} attempt(s): {result.detail}. "
                    "The run's result stands; check the webhook URL and the receiver.",
                )
            )
    with session_scope(settings.resolved_database_url()) as session:
        session.add_all(events)
    return True


class AlertWatcher:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.checked_by = f"{socket.gethostname()}:{os.getpid()}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kvcanary-alerts", daemon=True)

    @property
    def configured(self) -> bool:
        return bool(self.settings.alert_webhooks or self.settings.alert_slack_webhooks)

    def start(self) -> None:
        """Runs only where webhooks are configured; a process without any leaves runs for one that has."""
        if self.configured:
            self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                for run_id in unchecked_runs(self.settings):
                    if self._stop.is_set():
                        return
                    alert_run(self.settings, run_id, self.checked_by, self._stop)
            except Exception:
                log.exception("alert watcher pass failed; trying again")
            self._stop.wait(self.settings.alert_poll_s)
