"""One registry type for suites and metric kinds: listed once, built once, errors that name the known."""

from __future__ import annotations

import pytest

from evals import kinds, suites
from evals.registry import Registry


@pytest.mark.parametrize(("registry", "what"), [(suites.REGISTRY, "suite"), (kinds.REGISTRY, "metric kind")])
def test_each_registry_is_built_once_and_names_the_known(registry: Registry[object], what: str) -> None:
    entries = registry.all()
    assert registry.all() is entries  # built on first use, not again on every call
    assert len(entries) == len(registry.modules)  # one entry a listed module, none named twice
    first = next(iter(entries))
    assert registry.get(first) is entries[first]
    with pytest.raises(KeyError, match=f"unknown {what} 'nope'; known: {', '.join(sorted(entries))}"):
        registry.get("nope")


def test_a_suite_declares_its_metrics_with_the_registered_kinds() -> None:
    assert suites.get("wer").metrics[0].kind is kinds.get("wer")
    assert suites.registry() is suites.REGISTRY.all() and kinds.registry() is kinds.REGISTRY.all()
