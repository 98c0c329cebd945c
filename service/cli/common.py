"""What the `kvcanary` commands share: the console, exit codes, option parsing, the database.

Kept apart from the commands so that `run` (here) and `submit` (on a service) read `--label`,
`--compare` and `--expect` the same way and map a run's end to the same exit code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from service.report import cli_console
from service.schemas import RunDetail, check_labels, parse_label_pairs

if TYPE_CHECKING:
    from service.profiles import Expectation, Profile
    from service.settings import Settings

console = cli_console()
EXIT_PASS, EXIT_REGRESSION, EXIT_ERROR = 0, 1, 2

COMPARE_HELP = (
    "Arms on the same prompts, control first; repeatable. A word without '=' is a variant and starts an "
    "arm, key=value words override that arm's engine: 'stock,fixed', or "
    "'--compare fixed --compare fixed,max_num_batched_tokens=64'"
)
FRESH_ENGINES_HELP = (
    "Start a fresh engine for every arm (A/A floors); by default arms whose engine arguments match "
    "share one engine, switched between arms"
)
EXPECT_HELP = "ARM=pass or ARM=fail, repeatable: what each arm must do; the exit code then says whether it did"


def checked_labels(pairs: list[str]) -> dict[str, str]:
    """`--label` options as the API checks them: NUL, a lone surrogate (a non-UTF-8 argv byte) and
    bad keys are refused here, for `run` (which stores them directly) as for `submit`."""
    try:
        return check_labels(parse_label_pairs(pairs))
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc


def compare_arms(values: list[str]) -> list[str]:
    from service.arms import parse_compare

    try:
        return parse_compare(values)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc


def expectations(values: list[str]) -> dict[str, Expectation]:
    from service.arms import parse_expect

    try:
        return parse_expect(values)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc


def exit_code(run: RunDetail) -> int:
    """0 pass, 1 regression, 2 error; with expectations, 0 as expected and 1 unexpected (2 stays error)."""
    if run.expect and run.status in ("passed", "failed"):
        return EXIT_PASS if run.outcome == "as_expected" else EXIT_REGRESSION
    if run.status == "passed":
        return EXIT_PASS
    if run.status == "failed":
        return EXIT_REGRESSION
    return EXIT_ERROR


def prepared_db() -> str:
    """The configured database's URL, migrated to the latest schema."""
    from service.db.migrate import upgrade
    from service.settings import get_settings

    settings = get_settings()
    url = settings.resolved_database_url()
    upgrade(url)
    return url


def loaded_profiles(settings: Settings) -> dict[str, Profile]:
    """The configured profiles, or exit 2 with the reason a profile file is broken."""
    from service.profile_catalog import configured_profiles
    from service.profiles import ProfileError

    try:
        return configured_profiles(settings)
    except ProfileError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(EXIT_ERROR) from exc
