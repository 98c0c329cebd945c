"""Every operation of the OpenAPI document, fuzzed by schemathesis with each role and with none,
against a real `kvcanary serve` on SQLite: no 5xx, every response in its documented schema,
every status documented. Bounded examples keep it to CI's budget."""

from __future__ import annotations

import importlib
import json
import pkgutil
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from service.auth import Role, create_token
from service.db.session import session_scope
from tests.service.conftest import LiveService


def _import_all_of_schemathesis() -> None:
    """Import schemathesis whole while the test files are collected, before any test runs.

    pytest rewrites a plugin's modules as it imports them, parsing their source, and
    schemathesis imports some lazily, during a test. CPython 3.11 keeps the AST constructor's
    recursion depth interpreter-wide, so such a parse while a thread left by an earlier test of
    this worker parses too fails ("AST constructor recursion depth mismatch", cpython
    gh-106905; seen in CI on `schemathesis/specs/openapi/stateful/dependencies/inputs.py`).
    """
    for module in pkgutil.walk_packages(schemathesis.__path__, "schemathesis."):
        try:
            importlib.import_module(module.name)
        except ImportError:  # an optional extra this install lacks; the tests do not use it
            continue


_import_all_of_schemathesis()

CHECKS = [not_a_server_error, status_code_conformance, response_schema_conformance, content_type_conformance]
REVOKE = "/api/v1/tokens/{token_id}/revoke"
EXAMPLES = 12


@pytest.fixture(scope="module")
def service(idle_service: LiveService) -> LiveService:
    return idle_service


@pytest.fixture(scope="module")
def tokens(service: LiveService) -> dict[str, str]:
    made = {role.value: service.token(role, f"fuzz-{role.value}") for role in Role}
    with session_scope(service.database_url) as session:
        made["spare"] = create_token(session, "fuzz-spare", Role.VIEWER)
    return made


@pytest.fixture(scope="module")
def spare_token_id(service: LiveService, tokens: dict[str, str]) -> int:
    from service.auth import lookup

    with session_scope(service.database_url, write=False) as session:
        row = lookup(session, tokens["spare"])
        assert row is not None
        return row.id


@pytest.fixture(scope="module")
def api_schema(service: LiveService) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_url(f"{service.url}/openapi.json")


def _fuzz(
    operation: schemathesis.APIOperation, mode: GenerationMode, headers: list[dict[str, str]], spare_token_id: int
) -> None:
    # An admin's generated revoke hits the spare token, so the fuzzer never revokes its own tokens.
    pinned = {"token_id": spare_token_id} if operation.path == REVOKE else None

    @given(case=operation.as_strategy(generation_mode=mode, path_parameters=pinned))
    @settings(
        max_examples=EXAMPLES, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck)
    )
    def calls(case: schemathesis.Case) -> None:
        for caller in headers:
            case.call_and_validate(headers=caller, checks=CHECKS)

    calls()


def test_every_operation_as_every_role(
    api_schema: schemathesis.BaseSchema, tokens: dict[str, str], spare_token_id: int
) -> None:
    callers = [{}] + [{"Authorization": f"Bearer {tokens[role.value]}"} for role in Role]
    failures: list[str] = []
    operations = 0
    for result in api_schema.get_all_operations():
        operation = result.ok()
        operations += 1
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            try:
                _fuzz(operation, mode, callers, spare_token_id)
            except Unsatisfiable:
                assert mode == GenerationMode.NEGATIVE, operation.label  # nothing to get wrong: no input
            except Exception as exc:  # one operation's failure must not hide the others'
                failures.append(f"{operation.label} ({mode.value}): {exc}")
    assert operations >= 15
    assert not failures, "\n\n".join(failures)


def test_every_operation_with_a_body_reads_only_utf8_json(service: LiveService, tokens: dict[str, str]) -> None:
    """Beside the fuzzing (which sends what the document declares): each operation's own example,
    sent in UTF-16 or under a second Content-Type, is refused with the 415 its entry documents."""
    spec = httpx.get(f"{service.url}/openapi.json").json()
    admin = ("Authorization", f"Bearer {tokens['admin']}")
    checked = []
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            if "requestBody" not in operation:
                continue
            assert "415" in operation["responses"], (method, path)
            url = service.url + path.replace("{run_id}", "1").replace("{token_id}", "1")
            body = json.dumps(_example(spec, operation))
            for content, headers in (
                (body.encode("utf-16-le"), [admin, ("Content-Type", "application/json")]),
                (body.encode(), [admin, ("Content-Type", "application/json"), ("Content-Type", "text/plain")]),
            ):
                answer = httpx.request(method.upper(), url, content=content, headers=headers)
                assert answer.status_code == 415, (method, path, answer.status_code, answer.text[:200])
            checked.append(f"{method} {path}")
    assert len(checked) >= 4, checked


def _example(spec: dict[str, Any], operation: dict[str, Any]) -> Any:
    schema = operation["requestBody"]["content"]["application/json"]["schema"]
    if "$ref" in schema:
        schema = spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return (schema.get("examples") or [{}])[0]
