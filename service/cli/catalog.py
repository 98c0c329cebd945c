"""`kvcanary profiles`: how the configured profiles, vLLM lm-eval configs included, were read.

The catalogue is loaded inside the commands: reading a vLLM config needs the server's modules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from service.cli.common import EXIT_ERROR, console

if TYPE_CHECKING:
    from service.profile_catalog import Catalog

profiles_app = typer.Typer(help="Profiles, including vLLM lm-eval configs read as profiles", no_args_is_help=True)


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
