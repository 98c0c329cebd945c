"""`kvcanary mutants`: the mutation matrix, queued on a service or run on this host.

Fixed against each kernel mutant (kernels.mutants) on the profiles' suites: which suite catches
which mutant. The catalogue and the batch runner are imported inside the command, so that the
client's `kvcanary --help` lists it without the server's packages.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Annotated

import httpx
import typer

from service.cli.common import EXIT_ERROR, EXIT_PASS, checked_labels, console, loaded_profiles, prepared_db

if TYPE_CHECKING:
    from service.runs.mutation import MutationMatrix


def mutants(
    profile: Annotated[list[str], typer.Argument(help="Profiles, e.g. drift-tiny-gpu gsm8k-tiny-gpu")],
    mutant: Annotated[
        list[str] | None, typer.Option(help="Only this mutant (repeatable); default: the whole catalogue")
    ] = None,
    half: Annotated[
        str | None,
        typer.Option(help="A half of the generated mutants (kernels/generated_mutants.json): tuning or held-out"),
    ] = None,
    url: Annotated[str | None, typer.Option(help="Queue on this kvcanary service instead of running here")] = None,
    token: Annotated[
        str | None, typer.Option(envvar="KVCANARY_TOKEN", help="API token (admin role), with --url")
    ] = None,
    label: Annotated[list[str] | None, typer.Option(help="key=value, repeatable")] = None,
    show: Annotated[bool, typer.Option(help="Print the latest stored matrix; queue nothing")] = False,
    timeout: Annotated[float, typer.Option(min=0, help="With --url: seconds to wait for every run")] = 6 * 3600,
    poll: Annotated[float, typer.Option(min=0.1, help="With --url: seconds between status polls")] = 5.0,
) -> None:
    """The mutation matrix: fixed vs each kernel mutant (kernels.mutants) on the profiles' suites,
    through the queue; prints mutant x suite (caught? at how many items? how long?). `--half tuning`
    or `--half held-out` runs that half of the generated mutants. Exit 0 when every run ended, 2
    when one errored or the service failed."""
    from kernels.mutants import batch as batch_of
    from service.runs import mutation_batch
    from service.runs.mutation import MutationMatrix, markdown, new_batch_id

    try:
        chosen = batch_of(mutant, half)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    batch, labels = new_batch_id(), checked_labels(label or [])
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
    from service.runs import mutation_batch
    from service.runs.admission import RunRefused, fitted
    from service.runs.batches import latest_matrix
    from service.settings import get_settings

    settings = get_settings()
    profiles = loaded_profiles(settings)
    missing = [name for name in names if name not in profiles]
    if missing:
        console.print(f"[red]unknown profile {', '.join(missing)}; known profiles: {', '.join(sorted(profiles))}[/red]")
        raise typer.Exit(EXIT_ERROR)
    selected = [profiles[name] for name in names]
    if show:
        with session_scope(prepared_db(), write=False) as session:
            return [latest_matrix(session, p.name, [e.suite for e in p.suites]) for p in selected]
    try:
        for chosen_profile in selected:
            fitted(chosen_profile, on_this_host=True)
    except RunRefused as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(EXIT_ERROR) from exc
    by = os.environ.get("USER", "cli")
    return mutation_batch.run_here(settings, profiles, selected, chosen, batch, labels, by, console.print)
