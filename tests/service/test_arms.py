"""Arms (a kernel variant plus engine overrides) and expected outcomes, without an engine: their
names, the CLI's spelling, what the profile's engine refuses, the argv they become, the API that
queues them (a real `kvcanary serve`, worker off), idempotency, the migration of stored runs, and
the exit codes and JUnit of a run's outcome (how per-arm verdicts become it: test_scoring_rules.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from pydantic import ValidationError
from sqlalchemy import MetaData, Table, create_engine

from kernels.mutants import MUTANTS
from service.arms import describe_outcome, engine_change, parse_compare, parse_expect, plan, run_arms
from service.auth import Role
from service.cli.common import exit_code
from service.db.migrate import upgrade
from service.db.models import Run, SuiteResult
from service.db.session import session_scope
from service.engine.launcher import build_argv
from service.profiles import MAX_ARMS, ArmError, ArmSpec, Profile, ProfileError, RunOverrides, load_profile
from service.report import write_junit
from service.schemas import RunCreate, RunDetail
from service.settings import PACKAGED_PROFILES
from tests.service.conftest import LiveService, bearer

CHUNKED = "fixed,max_num_batched_tokens=64"
DEFAULTS = "gsm8k-tiny-arms"  # a profile with its own default arms and expectations


def cpu_profile(**fields: Any) -> Profile:
    spec = yaml.safe_load((PACKAGED_PROFILES / "gsm8k-tiny-cpu.yaml").read_text())
    return Profile.model_validate({**spec, "name": "gsm8k-tiny-cpu", **fields})


# names and spelling


def test_an_arm_is_named_by_its_variant_and_its_overrides_in_key_order() -> None:
    arm = ArmSpec.model_validate({"variant": "fixed", "engine": {"max_num_batched_tokens": 64, "enforce_eager": False}})
    assert arm.name == "fixed,enforce_eager=false,max_num_batched_tokens=64"
    assert ArmSpec.model_validate(arm.name) == arm  # the name is also its spelling
    assert ArmSpec.model_validate("fixed,max_num_batched_tokens=64,enforce_eager=false").name == arm.name
    for lenient in ("fixed,enforce_eager=0", "fixed,max_num_batched_tokens=6_4"):  # not JSON's true/false, 64
        with pytest.raises(ValidationError):
            ArmSpec.model_validate(lenient)
    assert ArmSpec.model_validate("stock").name == "stock" and ArmSpec(variant="legacy").stored() == {
        "name": "legacy",
        "variant": "legacy",
        "engine": {},
    }
    every = ArmSpec.model_validate(
        "legacy,block_size=32,enable_chunked_prefill=true,enable_prefix_caching=false,enforce_eager=true,"
        "kv_cache_dtype=auto,max_model_len=4096,max_num_batched_tokens=8192"
    )
    # file names, URL paths and query values take it as it is: no quoting needed
    assert re.fullmatch(r"[a-z0-9_]+(,[a-z_]+=[a-z0-9_]+)*", every.name) and len(every.name) < 200
    assert httpx.URL("http://h/x", params={"arm": every.name}).params["arm"] == every.name


@pytest.mark.parametrize(
    ("spelling", "reason"),
    [
        ("fixed,foo=1", "engine override 'foo' is not one an arm may set; it may set: max_num_batched_tokens"),
        ("fixed,max_num_batched_tokens", "'max_num_batched_tokens' must be key=value"),
        ("fixed,block_size=16,block_size=32", "sets block_size twice"),
        ("fixed,max_num_batched_tokens=lots", "valid integer"),
        ("nonsense", "Input should be 'fixed', 'legacy', 'chunk_context_skip'"),
    ],
)
def test_a_misspelt_arm_is_refused_with_what_is_wrong(spelling: str, reason: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(reason)):
        ArmSpec.model_validate(spelling)


def test_the_cli_spelling_of_compare_and_expect() -> None:
    assert parse_compare(["stock,fixed"]) == ["stock", "fixed"]  # the plain form keeps its meaning
    assert parse_compare(["fixed", CHUNKED]) == ["fixed", CHUNKED]
    assert parse_compare(["fixed,fixed,max_num_batched_tokens=64,block_size=32"]) == [
        "fixed",
        "fixed,max_num_batched_tokens=64,block_size=32",
    ]
    with pytest.raises(ArmError, match="sets an engine override before any variant"):
        parse_compare(["max_num_batched_tokens=64,fixed"])
    assert parse_expect(["stock=pass", f"{CHUNKED}=fail"]) == {"stock": "pass", CHUNKED: "fail"}
    with pytest.raises(ArmError, match="must be ARM=pass or ARM=fail"):
        parse_expect(["legacy=caught"])


# what the engine refuses, and the argv


def test_overrides_reach_the_engine_command_line() -> None:
    arm = ArmSpec.model_validate(
        "fixed,block_size=32,enable_chunked_prefill=false,enable_prefix_caching=true,enforce_eager=false,"
        "max_model_len=512,max_num_batched_tokens=1024"
    )
    from service.arms import apply

    argv = build_argv(apply(cpu_profile(), arm), port=8000, python="python")
    joined = " ".join(argv)
    assert "--enforce-eager" not in argv and "--max-num-batched-tokens 1024" in joined
    assert "--no-enable-chunked-prefill" in argv and "--enable-prefix-caching" in argv
    assert "--block-size 32" in joined and "--max-model-len 512" in joined and "--kv-cache-dtype" not in argv
    assert "--enforce-eager" in build_argv(cpu_profile(), port=8000, python="python")  # the profile's own


@pytest.mark.parametrize(
    ("arm", "canaries", "refusal"),
    [
        ("fixed,kv_cache_dtype=fp8", [], "kv_cache_dtype=fp8: kvcanary's kernels read only fp16, bf16 and fp32"),
        ("stock,kv_cache_dtype=fp8", ["nan_kv_tail"], "only an arm with variant stock and no canaries"),
        (
            "fixed,enable_chunked_prefill=false,max_model_len=2048,max_num_batched_tokens=64",
            [],
            "max_num_batched_tokens=64 is below max_model_len=2048 with chunked prefill off: vLLM refuses",
        ),
    ],
)
def test_an_arm_the_engine_cannot_take_is_refused_by_name(arm: str, canaries: list[str], refusal: str) -> None:
    arms = [ArmSpec(variant="fixed"), ArmSpec.model_validate(arm)]
    with pytest.raises(ArmError, match=re.escape(f"arm {arms[1].name}: ") + ".*" + re.escape(refusal)):
        plan(cpu_profile(), RunOverrides(canaries=canaries), arms, None)


def test_what_the_engine_can_take_is_accepted() -> None:
    ok = ["stock,kv_cache_dtype=fp8", "fixed,kv_cache_dtype=auto", "fixed,enforce_eager=false", CHUNKED]
    planned = plan(cpu_profile(), RunOverrides(), [ArmSpec.model_validate(a) for a in ok], {CHUNKED: "pass"})
    assert [a["name"] for a in planned.stored_arms()] == ok and planned.expect == {CHUNKED: "pass"}
    # what a run stores is what its worker executes, and a run without arms has the profile's one
    assert run_arms(planned.stored_arms(), cpu_profile()) == planned.arms
    assert run_arms([], cpu_profile(kernels={"variant": "legacy"})) == [ArmSpec(variant="legacy")]


def test_an_arm_knows_which_engine_arguments_it_changed_against_the_control() -> None:
    """The verdicts hold a kernel-only arm (an empty change) to more than an engine arm."""
    profile = cpu_profile(engine={"max_num_batched_tokens": 2048, "enforce_eager": True})
    fixed, stock = ArmSpec(variant="fixed"), ArmSpec(variant="stock")
    assert engine_change(profile, ArmSpec(variant="batch_row_shift"), fixed) == {}
    assert engine_change(profile, fixed, stock) == {}
    assert engine_change(profile, ArmSpec.model_validate(CHUNKED), fixed) == {"max_num_batched_tokens": [2048, 64]}
    graphs = engine_change(profile, ArmSpec.model_validate("fixed,enforce_eager=false"), stock)
    assert graphs == {"enforce_eager": [True, False]}


def test_an_override_the_profile_also_passes_as_an_extra_argument_is_refused() -> None:
    profile = cpu_profile(engine={"extra_args": ["--block-size=64"]})
    with pytest.raises(ArmError, match=re.escape("passes --block-size in engine.extra_args, which would win")):
        plan(profile, RunOverrides(), [ArmSpec(variant="fixed"), ArmSpec.model_validate("fixed,block_size=32")], None)


def test_a_profile_declares_default_arms_and_expectations_checked_when_it_loads(tmp_path: Path) -> None:
    spec = yaml.safe_load((PACKAGED_PROFILES / "gsm8k-tiny-cpu.yaml").read_text())
    good = {**spec, "compare": ["fixed", {"variant": "fixed", "engine": {"max_num_batched_tokens": 64}}]}
    good["expect"] = {"fixed": "pass", CHUNKED: "pass"}
    (tmp_path / "good.yaml").write_text(yaml.safe_dump(good))
    profile = load_profile(tmp_path / "good.yaml")
    assert [a.name for a in profile.compare or []] == ["fixed", CHUNKED]
    default = plan(profile, RunOverrides(), None, None)
    assert [a.name for a in default.arms] == ["fixed", CHUNKED] and default.expect == good["expect"]
    # a request's arms replace the profile's, and its expectations with them
    asked = plan(profile, RunOverrides(), [ArmSpec(variant="stock"), ArmSpec(variant="fixed")], None)
    assert [a.name for a in asked.arms] == ["stock", "fixed"] and asked.expect is None
    cases = {
        "typo.yaml": ({**good, "expect": {"fixed,max_num_batched_tokens=65": "pass"}}, "not an arm of this run"),
        "fp8.yaml": ({**good, "compare": ["fixed", "fixed,kv_cache_dtype=fp8"], "expect": None}, "kv_cache_dtype=fp8"),
        "twice.yaml": ({**good, "compare": ["fixed", "fixed"], "expect": None}, "lists arm fixed more than once"),
        "nightly.yaml": (
            {**good, "schedule": {"cron": "0 2 * * *", "expect": {"legacy": "fail"}}},
            "expect names legacy, not an arm of this run; its arms: fixed, fixed,max_num_batched_tokens=64",
        ),
    }
    for name, (bad, reason) in cases.items():
        (tmp_path / name).write_text(yaml.safe_dump(bad))
        with pytest.raises(ProfileError, match=re.escape(reason)):
            load_profile(tmp_path / name)


def test_a_single_arm_run_may_expect_of_its_one_arm() -> None:
    planned = plan(cpu_profile(), RunOverrides(kernel_variant="legacy"), None, {"legacy": "fail"})
    assert planned.arms == [] and planned.expect == {"legacy": "fail"}
    with pytest.raises(ArmError, match="its arms: fixed"):
        plan(cpu_profile(), RunOverrides(), None, {"legacy": "fail"})


# outcome


def detail(status: str, outcome: str | None, expect: dict[str, str] | None, verdict: str = "fail") -> RunDetail:
    metric = {
        "arm": "legacy", "suite": "gsm8k", "metric": "strict-match", "value": 0.1, "n": 200, "stderr": None,
        "ci_low": None, "ci_high": None, "direction": "higher", "empty_response_rate": 0.0, "baseline": 1.0,
        "threshold": 0.92, "verdict": verdict, "explanation": "below the threshold", "details": {},
    }  # fmt: skip
    verdicts = {"fixed": "pass", "legacy": "fail" if verdict == "fail" else "pass"}
    return RunDetail.model_validate({
        "id": 3, "profile": "p", "status": status, "verdict": verdict, "trigger": "ci", "triggered_by": "ci",
        "labels": {}, "variants": ["fixed", "legacy"], "attempt": 1, "created_at": datetime.now(UTC),
        "started_at": None, "finished_at": None, "duration_s": None,
        "progress": {"done": 0, "total": 0, "phase": "", "eta_s": None},
        "arms": [{"name": n, "variant": n, "engine": {}} for n in ("fixed", "legacy")],
        "outcome": outcome, "expect": expect, "arm_verdicts": verdicts,
        "outcome_summary": describe_outcome(expect, verdicts) if outcome else "",
        "verdict_summary": "", "error": "", "max_attempts": 1, "overrides": {}, "engine": {}, "timings": {},
        "metrics": [metric], "log_tail": "", "links": {},
    })  # fmt: skip


def test_exit_codes_and_junit_follow_the_outcome_when_expectations_are_given(tmp_path: Path) -> None:
    expect = {"fixed": "pass", "legacy": "fail"}
    assert exit_code(detail("failed", "as_expected", expect)) == 0  # the mutant was caught
    assert exit_code(detail("passed", "unexpected", expect, verdict="pass")) == 1  # it went unseen
    assert exit_code(detail("error", "unexpected", expect)) == 2  # an error stays an error
    assert exit_code(detail("failed", None, None)) == 1  # no expectations: the verdict decides
    junit = tmp_path / "caught.xml"
    write_junit(detail("failed", "as_expected", expect), junit)
    suite = ET.parse(junit).getroot()
    assert (suite.get("tests"), suite.get("failures")) == ("2", "0") and suite.find(".//failure") is None
    write_junit(detail("passed", "unexpected", expect, verdict="pass"), junit)
    [failure] = ET.parse(junit).getroot().iter("failure")
    assert failure.get("type") == "unexpected" and "legacy was expected to fail and passed" in failure.get(
        "message", ""
    )


# the API, the CLI and stored runs


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveService]:
    """`kvcanary serve` (worker off) with the CPU fixture profile and a copy that has default arms."""
    from tests.conftest import OFFLINE_ENV

    root = tmp_path_factory.mktemp("arms")
    profiles = root / "profiles"
    profiles.mkdir()
    spec = yaml.safe_load((PACKAGED_PROFILES / "gsm8k-tiny-cpu.yaml").read_text())
    (profiles / "gsm8k-tiny-cpu.yaml").write_text(yaml.safe_dump(spec))
    defaults = {**spec, "compare": ["fixed", CHUNKED], "expect": {"fixed": "pass", CHUNKED: "pass"}}
    (profiles / f"{DEFAULTS}.yaml").write_text(yaml.safe_dump(defaults))
    env = {
        **os.environ,
        **OFFLINE_ENV,
        "KVCANARY_DATA_DIR": str(root / "data"),
        "KVCANARY_START_WORKER": "false",
        "KVCANARY_PROFILES_DIR": str(profiles),
    }
    (root / "data").mkdir()
    live = LiveService(root / "data", env)
    live.start()
    yield live
    live.stop()


TOKENS: dict[str, str] = {}  # one CI token per service: an idempotency key is scoped to its caller


def post(service: LiveService, body: dict[str, Any], key: str | None = None) -> httpx.Response:
    token = TOKENS.get(service.url) or TOKENS.setdefault(service.url, service.token(Role.CI, "arms-ci"))
    headers = bearer(token)
    if key:
        headers["Idempotency-Key"] = key
    return httpx.post(f"{service.url}/api/v1/runs", json=body, headers=headers)


def test_the_api_queues_arms_in_either_form_and_documents_each(service: LiveService) -> None:
    arms = [{"variant": "fixed"}, {"variant": "fixed", "engine": {"max_num_batched_tokens": 64}}]
    created = post(service, {"profile": "gsm8k-tiny-cpu", "compare": arms, "expect": {CHUNKED: "pass"}})
    assert created.status_code == 201, created.text
    run = created.json()
    assert run["variants"] == ["fixed", CHUNKED] and run["expect"] == {CHUNKED: "pass"} and run["outcome"] is None
    assert run["arms"] == [
        {"name": "fixed", "variant": "fixed", "engine": {}},
        {"name": CHUNKED, "variant": "fixed", "engine": {"max_num_batched_tokens": 64}},
    ]
    named = post(service, {"profile": "gsm8k-tiny-cpu", "compare": ["stock", CHUNKED]}).json()
    assert named["arms"][1]["engine"] == {"max_num_batched_tokens": 64}
    listed = httpx.get(f"{service.url}/api/v1/runs", params={"limit": 2}).json()["items"]
    assert [r["variants"] for r in listed] == [["stock", CHUNKED], ["fixed", CHUNKED]]
    samples = httpx.get(f"{service.url}/api/v1/runs/{named['id']}/samples", params={"arm": CHUNKED})
    assert samples.status_code == 200 and samples.json()["total"] == 0
    page = httpx.get(f"{service.url}/runs/{run['id']}")
    assert page.status_code == 200 and 'data-arm="fixed,max_num_batched_tokens=64"' in page.text
    assert "max_num_batched_tokens 64" in page.text and "not judged yet" in page.text


def test_a_trigger_may_ask_for_fresh_engines_and_the_run_shows_which_arms_shared_one(service: LiveService) -> None:
    """`overrides.arm_engines: fresh` is stored with the run's profile; the engine facts a worker
    writes (here by hand: the worker is off) become the run's engine groups, on the API and the page."""
    fresh = post(
        service, {"profile": "gsm8k-tiny-cpu", "compare": ["fixed", "legacy"], "overrides": {"arm_engines": "fresh"}}
    )
    assert fresh.status_code == 201, fresh.text
    assert fresh.json()["profile_snapshot"]["arm_engines"] == "fresh" and fresh.json()["engine_groups"] == []
    run = post(service, {"profile": "gsm8k-tiny-cpu", "compare": ["fixed", "legacy", CHUNKED]}).json()
    assert run["profile_snapshot"]["arm_engines"] == "shared"
    switch = {"generation": 1, "prefix_cache": {"caching": True, "hits_before_reset": 128.0, "hits_after_reset": 0.0}}
    facts = {
        "fixed": {"engine_use": {"engine": 1, "started_for": "fixed", "fresh": "the first arm"}},
        "legacy": {"engine_use": {"engine": 1, "started_for": "fixed", "switch": switch}},
        CHUNKED: {"engine_use": {"engine": 2, "started_for": CHUNKED, "fresh": "its engine arguments differ"}},
    }
    with session_scope(service.database_url) as session:
        row = session.get(Run, run["id"])
        assert row is not None
        row.engine = facts
    detail = httpx.get(f"{service.url}/api/v1/runs/{run['id']}").json()
    assert detail["engine_groups"] == [["fixed", "legacy"], [CHUNKED]]
    page = httpx.get(f"{service.url}/runs/{run['id']}").text
    assert re.search(r"Engine 1</th><td><span class=\"mono\">fixed</span>, <span class=\"mono\">legacy</span>", page)
    assert "one engine, switched between arms" in page and "started for this arm: its engine arguments differ" in page
    assert "128 tokens hit before the reset, 0 after" in page


def test_the_profiles_default_arms_run_unless_the_request_names_its_own(service: LiveService) -> None:
    default = post(service, {"profile": DEFAULTS}).json()
    assert default["variants"] == ["fixed", CHUNKED] and default["expect"] == {"fixed": "pass", CHUNKED: "pass"}
    replaced = post(service, {"profile": DEFAULTS, "compare": ["stock", "fixed"]}).json()
    assert replaced["variants"] == ["stock", "fixed"] and replaced["expect"] is None
    [shown] = [p for p in httpx.get(f"{service.url}/api/v1/profiles").json() if p["name"] == DEFAULTS]
    assert shown["arms"] == ["fixed", CHUNKED] and shown["expect"] == {"fixed": "pass", CHUNKED: "pass"}
    assert "Default arms" in httpx.get(f"{service.url}/profiles/{DEFAULTS}").text


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({"compare": ["fixed", "fixed,kv_cache_dtype=fp8"]}, "arm fixed,kv_cache_dtype=fp8: kv_cache_dtype=fp8"),
        ({"compare": ["fixed", {"variant": "fixed", "engine": {"swap_space": 4}}]}, "'swap_space' is not one an arm"),
        ({"compare": ["fixed", "stock"], "expect": {"legacy": "fail"}}, "expect names legacy, not an arm"),
        ({"compare": ["fixed", "fixed"]}, "compare lists an arm twice"),
        (
            {"compare": ["fixed", *(f"fixed,max_num_batched_tokens={64 + i}" for i in range(MAX_ARMS))]},
            f"List should have at most {MAX_ARMS} items",
        ),
        ({"expect": {"fixed": "caught"}}, "Input should be 'pass' or 'fail'"),
    ],
)
def test_the_api_refuses_arms_and_expectations_it_cannot_run_with_the_reason(
    service: LiveService, body: dict[str, Any], reason: str
) -> None:
    response = post(service, {"profile": "gsm8k-tiny-cpu", **body})
    assert response.status_code == 422 and reason in response.text, response.text


def test_one_run_holds_fixed_and_the_whole_mutant_catalogue_and_no_more_than_its_cap() -> None:
    """`kvcanary mutants` queues fixed and every catalogued mutant as one run's arms."""
    whole = ["fixed", *MUTANTS]
    assert len(whole) < MAX_ARMS
    assert RunCreate.model_validate({"profile": "gsm8k-tiny-cpu", "compare": whole}).compare is not None
    Profile.model_validate({**load_profile(PACKAGED_PROFILES / "gsm8k-tiny-cpu.yaml").model_dump(), "compare": whole})
    too_many = [*whole, *(f"fixed,max_num_batched_tokens={64 + i}" for i in range(MAX_ARMS + 1 - len(whole)))]
    with pytest.raises(ValidationError, match=f"at most {MAX_ARMS} items"):
        RunCreate.model_validate({"profile": "gsm8k-tiny-cpu", "compare": too_many})


def test_an_idempotency_key_matches_the_same_arms_in_either_form_and_refuses_others(service: LiveService) -> None:
    first = post(service, {"profile": "gsm8k-tiny-cpu", "compare": ["stock", "fixed"]}, key="build-1")
    again = post(service, {"profile": "gsm8k-tiny-cpu", "compare": [{"variant": "stock"}, "fixed"]}, key="build-1")
    assert (first.status_code, again.status_code) == (201, 200) and again.json()["id"] == first.json()["id"]
    other = post(service, {"profile": "gsm8k-tiny-cpu", "compare": ["stock", CHUNKED]}, key="build-1")
    assert other.status_code == 409 and "with a different arms" in other.text
    expecting = post(
        service, {"profile": "gsm8k-tiny-cpu", "compare": ["stock", "fixed"], "expect": {"stock": "fail"}}, "build-1"
    )
    assert expecting.status_code == 409 and "expect" in expecting.text


def test_submit_sends_the_cli_spelling_of_arms_and_expectations(service: LiveService) -> None:
    argv = [sys.executable, "-m", "service", "submit", "--url", service.url, "--profile", "gsm8k-tiny-cpu"]
    argv += ["--compare", "fixed", "--compare", CHUNKED, "--expect", f"{CHUNKED}=pass", "--expect", "fixed=pass"]
    env = {**os.environ, "KVCANARY_TOKEN": service.token(Role.CI, "arms-cli")}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    run_id = int(re.search(r"run (\d+) queued", done.stdout).group(1))  # type: ignore[union-attr]
    run = httpx.get(f"{service.url}/api/v1/runs/{run_id}").json()
    assert run["variants"] == ["fixed", CHUNKED] and run["expect"] == {CHUNKED: "pass", "fixed": "pass"}
    assert run["overrides"] == {} and run["profile_snapshot"]["arm_engines"] == "shared"
    fresh = subprocess.run([*argv, "--fresh-engines"], env=env, capture_output=True, text=True, timeout=120)
    fresh_id = int(re.search(r"run (\d+) queued", fresh.stdout).group(1))  # type: ignore[union-attr]
    fresh_run = httpx.get(f"{service.url}/api/v1/runs/{fresh_id}").json()
    assert (
        fresh_run["overrides"] == {"arm_engines": "fresh"} and fresh_run["profile_snapshot"]["arm_engines"] == "fresh"
    )
    bad = subprocess.run([*argv[:8], "--compare", "fixed,kv_cache_dtype=fp8,fixed"], env=env, capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert bad.returncode == 2 and "kv_cache_dtype=fp8" in bad.stdout + bad.stderr


def test_stored_runs_keep_their_variants_as_plain_arms(empty_database: str) -> None:
    url = empty_database
    upgrade(url, "0005")
    engine = create_engine(url)
    runs = Table("runs", MetaData(), autoload_with=engine)
    row = {
        "profile": "p", "status": "passed", "trigger": "ci", "triggered_by": "ci", "labels": {}, "overrides": {},
        "attempt": 1, "max_attempts": 1, "cancel_requested": False, "created_at": datetime.now(UTC),
        "progress_done": 0, "progress_total": 0, "progress_phase": "", "verdict_summary": "", "error": "",
        "engine": {}, "timings": {}, "log_tail": "", "run_dir": "",
    }  # fmt: skip
    with engine.begin() as connection:
        connection.execute(runs.insert(), [{**row, "variants": ["stock", "fixed"]}, {**row, "variants": []}])
    engine.dispose()
    upgrade(url)
    with session_scope(url) as session:
        ab, single = session.query(Run).order_by(Run.id).all()
        assert ab.arms == [{"name": v, "variant": v, "engine": {}} for v in ("stock", "fixed")] and single.arms == []
        assert RunDetail.of_run(ab, []).variants == ["stock", "fixed"] and ab.outcome is None
        # an arm name longer than a variant fits where samples and results keep it
        name = ArmSpec.model_validate("legacy,block_size=32,enable_chunked_prefill=true,max_num_batched_tokens=64").name
        session.add(SuiteResult(run_id=ab.id, arm=name, suite="gsm8k", metric="m", value=1.0, n=1))


def test_kvcanary_run_refuses_arms_and_expectations_before_any_engine_starts(tmp_path: Path) -> None:
    from tests.conftest import OFFLINE_ENV

    env = {**os.environ, **OFFLINE_ENV, "KVCANARY_DATA_DIR": str(tmp_path / "data")}
    base = [sys.executable, "-m", "service", "run", "gsm8k-tiny-cpu"]
    cases = [
        (["--compare", "fixed,fixed,kv_cache_dtype=fp8"], "arm fixed,kv_cache_dtype=fp8: kv_cache_dtype=fp8"),
        (["--compare", "stock,fixed", "--expect", "legacy=fail"], "expect names legacy, not an arm of this run"),
        (["--expect", "fixed=caught"], "must be ARM=pass or ARM=fail"),
    ]
    for extra, reason in cases:
        done = subprocess.run([*base, *extra], env=env, capture_output=True, text=True, timeout=120)
        said = " ".join((done.stdout + done.stderr).split())
        assert done.returncode == 2 and reason in said, said
    assert not (tmp_path / "data" / "runs").exists() or not any((tmp_path / "data" / "runs").iterdir())
