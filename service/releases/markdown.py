"""A release summary as markdown for release notes: the one line, the blocking reasons, one table.

Every text that comes from a label, a profile, an arm or a run's error is escaped as a table
cell: a backslash before each character that could end a cell (`|`) or start inline markup
(emphasis, code, links, HTML, entities, strikethrough), and before a leading list or heading
marker; line breaks become spaces. Dots, dashes and colons inside text stay as they are.
"""

from __future__ import annotations

import re

from service.releases.schemas import NOT_RUN, MetricOutcome, ProfileRelease, ReleaseSummary

_ESCAPED = {ord(c): "\\" + c for c in "\\`*_{}[]<>|#!&~$"}
_LEADING_MARKER = re.compile(r"^(\d+)([.)])(?=\s|$)|^([-+=])")
STATE_WORD = {"ready": "READY", "blocked": "BLOCKED", "incomplete": "INCOMPLETE"}


def md(text: str) -> str:
    """`text` as literal markdown inline text, safe inside a table cell."""
    flat = " ".join(text.splitlines()).translate(_ESCAPED)
    return _LEADING_MARKER.sub(lambda m: f"{m[1]}\\{m[2]}" if m[1] else f"\\{m[3]}", flat)


def _change(row: ProfileRelease, metric: MetricOutcome) -> str:
    if row.comparison is None:
        return md(row.previous_note) if row.previous_note else "—"
    parts = [
        f"{md(c.previous_shown)} → {md(c.current_shown)} ({md(c.delta_shown)}{', worse' if c.worse else ''})"
        for c in row.comparison.metrics
        if (c.arm, c.suite, c.metric) == (metric.arm, metric.suite, metric.metric)
    ]
    parts += [
        md(p.summary)
        for p in row.comparison.paired
        if (p.arm, p.suite) == (metric.arm, metric.suite) and p.metric in (None, metric.metric)
    ]
    link = row.comparison.diff_links.get(metric.arm)
    if link and parts:
        parts.append(f"[diff]({link.replace(')', '%29').replace('(', '%28')})")
    return "; ".join(parts) or "—"


def _rows(row: ProfileRelease) -> list[str]:
    profile = md(row.profile) + (" (required)" if row.required else "")
    run = f"#{row.run.id}" if row.run is not None else "—"
    if row.history:
        run += f" ({md(row.history)})"
    if not row.metrics:
        what = {"running": f"running (run #{row.pending_run_id})", NOT_RUN: "not run"}.get(row.outcome, row.outcome)
        note = md("; ".join(row.reasons)) if row.reasons else ""
        return [f"| {profile} | {md(what)} | {run} | — | — | — | — | — | {note or '—'} |"]
    lines = []
    arms = {m.arm for m in row.metrics}
    for m in row.metrics:
        name = f"{m.suite}.{m.metric}" if m.metric else m.suite
        arm = md(m.arm) if len(arms) > 1 else "—"
        verdict = "not run" if m.verdict == NOT_RUN else m.verdict.replace("_", " ")
        lines.append(
            f"| {profile} | {md(row.outcome.replace('_', ' '))} | {run} | {arm} | {md(name)} | "
            f"{md(m.shown)} | {md(m.baseline_shown)} | {md(verdict)} | {_change(row, m)} |"
        )
    return lines


def release_markdown(summary: ReleaseSummary) -> str:
    """What `kvcanary release-report` prints: paste it into release notes."""
    title = md(f"{summary.key}={summary.value}")
    out = [f"## kvcanary release {title}: {STATE_WORD[summary.state]}", "", md(summary.line), ""]
    if summary.blocking:
        out += ["Blocking:", "", *(f"- {md(reason)}" for reason in summary.blocking), ""]
    if summary.missing:
        out += ["Not run yet:", "", *(f"- {md(reason)}" for reason in summary.missing), ""]
    compared = md(f"{summary.key}={summary.previous}") if summary.previous is not None else None
    out += [f"Compared with {compared}." if compared else md(summary.previous_note) + ".", ""]
    out += [
        f"| profile | outcome | run | arm | metric | value | baseline | verdict | change since {compared or '—'} |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in summary.profiles:
        out += _rows(row)
    exploratory = [(row, run) for row in summary.profiles for run in row.exploratory]
    if exploratory:
        out += ["", "Exploratory runs (shown, never deciding):", ""]
        out += [f"- {md(row.profile)} #{run.id} {md(run.status)}: {md(run.why)}" for row, run in exploratory[:20]]
        if len(exploratory) > 20:
            out.append(f"- and {len(exploratory) - 20} more")
    scored = [row for row in summary.profiles if row.mutation is not None]
    if scored:
        out += ["", "Mutation score (the latest `kvcanary mutants` batch of each profile):", ""]
        out += [
            f"- {md(row.profile)}: {row.mutation.caught} of {row.mutation.mutants} kernel mutants seen "
            f"({row.mutation.judged} finished, batch {md(row.mutation.batch)} started by "
            f"{md(row.mutation.started_by)} ({md(row.mutation.started_role)}) "
            f"at {row.mutation.started_at:%Y-%m-%d %H:%M} UTC)"
            for row in scored
            if row.mutation is not None
        ]
    out += ["", f"Source: {summary.links.get('dashboard', '')}"]
    return "\n".join(out) + "\n"
