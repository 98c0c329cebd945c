"""`kvcanary release-report`: a release's summary from a service, for release notes or a gate.

A client command like `submit`: the release modules it reads are imported inside it.
"""

from __future__ import annotations

from typing import Annotated, Literal

import httpx
import typer

from service.cli.common import EXIT_ERROR, EXIT_PASS, EXIT_REGRESSION, console

EXIT_INCOMPLETE = 3
RELEASE_EXIT = {"ready": EXIT_PASS, "blocked": EXIT_REGRESSION, "incomplete": EXIT_INCOMPLETE}


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
