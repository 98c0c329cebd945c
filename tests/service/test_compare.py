"""GET /api/v1/runs/{a}/diff/{b} on a real SQLite file, samples written by the run store."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from evals import suites as suite_registry
from evals.logprob_drift import ArmOutput, compare, pack
from evals.records import Sample
from service.app import create_app
from service.auth import Role, create_token
from service.db.models import Run
from service.db.session import session_scope
from service.profiles import ArmSpec
from service.runs import store
from service.settings import Settings


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    return Settings(data_dir=tmp_path / "data", profiles_dir=profiles, start_worker=False)


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as client:
        yield client


def answer(key: str, right: bool, response: str | None = None) -> Sample:
    """A GSM8k-like item, right or wrong under both of its metrics."""
    extracted = "42" if right else "41"
    return Sample(
        key=key,
        prompt_hash=f"h-{key}",
        target="42",
        response=response or f"... so the answer is {extracted}",
        extracted={"strict-match": extracted, "flexible-extract": extracted},
        correct={"strict-match": right, "flexible-extract": right},
        prompt=f"Question: item {key}?\nAnswer:",
    )


def utterance(key: str, errors: int, words: int = 10) -> Sample:
    return Sample(
        key=key,
        prompt_hash=f"h-{key}",
        target=f"reference words of {key}",
        response=f"hypothesis with {errors} errors",
        data={"wer": {"substitutions": errors, "deletions": 0, "insertions": 0, "ref_words": words}},
    )


def add_run(settings: Settings, samples: dict[tuple[str, str], Sequence[Sample]], arms: Sequence[str] = ()) -> int:
    """A finished run whose (arm, suite) samples go through `store.save_samples`, as a worker's do."""
    with session_scope(settings.resolved_database_url()) as session:
        run = Run(
            profile="fixture",
            status="passed",
            trigger="ci",
            arms=[ArmSpec.model_validate(arm).stored() for arm in arms],
        )
        session.add(run)
        session.flush()
        for (arm, suite), rows in samples.items():
            primary = suite_registry.get(suite).metrics[0].name
            store.save_samples(session, run.id, arm, suite, primary, rows)
        return run.id


def test_accuracy_flips_each_way_with_both_responses(client: TestClient, settings: Settings) -> None:
    reference = [answer(f"q{i}", right=i < 8) for i in range(10)]
    candidate = [
        answer(f"q{i}", right=(i < 8 and i != 2) or i == 8, response="a different working" if i == 2 else None)
        for i in range(10)
    ]
    a = add_run(settings, {("fixed", "gsm8k"): reference})
    b = add_run(settings, {("fixed", "gsm8k"): candidate})

    response = client.get(f"/api/v1/runs/{a}/diff/{b}")
    assert response.status_code == 200, response.text
    diff = response.json()
    assert (diff["a"]["run_id"], diff["b"]["run_id"]) == (a, b)
    [suite] = diff["suites"]
    assert suite["suite"] == "gsm8k" and suite["kind"] == "accuracy"
    by_metric = {m["metric"]: m for m in suite["accuracy"]}
    assert sorted(by_metric) == ["flexible-extract", "strict-match"]
    strict = by_metric["strict-match"]
    assert strict["matched"] == 10
    [down] = strict["right_to_wrong"]
    [up] = strict["wrong_to_right"]
    assert down["key"] == "q2" and up["key"] == "q8"
    assert down["response_a"] == "... so the answer is 42"
    assert down["response_b"] == "a different working"
    assert (down["extracted_a"], down["extracted_b"]) == ("42", "41")
    assert (up["extracted_a"], up["extracted_b"]) == ("41", "42")


def test_wer_changes_largest_first_and_capped(client: TestClient, settings: Settings) -> None:
    before = [utterance(f"u{i}", e) for i, e in enumerate([0, 1, 2, 0, 3])]
    after = [utterance(f"u{i}", e) for i, e in enumerate([0, 4, 2, 1, 0])]
    a = add_run(settings, {("fixed", "wer"): before})
    b = add_run(settings, {("fixed", "wer"): after})

    wer = client.get(f"/api/v1/runs/{a}/diff/{b}").json()["suites"][0]["wer"]
    assert (wer["matched"], wer["worse"], wer["better"]) == (5, 2, 1)
    assert [(c["key"], c["errors_a"], c["errors_b"]) for c in wer["changes"]] == [
        ("u1", 1, 4),
        ("u4", 3, 0),
        ("u3", 0, 1),
    ]
    assert wer["changes"][0]["target"] == "reference words of u1"
    top = client.get(f"/api/v1/runs/{a}/diff/{b}", params={"top": 2}).json()["suites"][0]["wer"]
    assert [c["key"] for c in top["changes"]] == ["u1", "u4"]
    assert top["worse"] == 2, "the counts cover every utterance, not only the listed ones"


def test_the_two_arms_of_one_ab_run(client: TestClient, settings: Settings) -> None:
    stock = [answer(f"q{i}", right=i != 0) for i in range(4)]
    fixed = [answer(f"q{i}", right=True) for i in range(4)]
    run = add_run(settings, {("stock", "gsm8k"): stock, ("fixed", "gsm8k"): fixed}, arms=["stock", "fixed"])

    diff = client.get(f"/api/v1/runs/{run}/diff/{run}", params={"arm_a": "stock", "arm_b": "fixed"}).json()
    assert (diff["a"]["arm"], diff["b"]["arm"]) == ("stock", "fixed")
    strict = next(m for m in diff["suites"][0]["accuracy"] if m["metric"] == "strict-match")
    assert [f["key"] for f in strict["wrong_to_right"]] == ["q0"] and strict["right_to_wrong"] == []

    other = add_run(settings, {("fixed", "gsm8k"): stock})
    default = client.get(f"/api/v1/runs/{other}/diff/{run}").json()
    assert default["b"]["arm"] == "fixed", "an A/B run is compared by its treatment arm unless asked"


def test_suites_in_one_run_only_are_named(client: TestClient, settings: Settings) -> None:
    a = add_run(settings, {("fixed", "gsm8k"): [answer("q0", True)], ("fixed", "wer"): [utterance("u0", 1)]})
    b = add_run(settings, {("fixed", "gsm8k"): [answer("q0", False)]})

    diff = client.get(f"/api/v1/runs/{a}/diff/{b}").json()
    assert [s["suite"] for s in diff["suites"]] == ["gsm8k"]
    assert (diff["only_in_a"], diff["only_in_b"]) == (["wer"], [])


def test_bad_requests_say_what_is_wrong(client: TestClient, settings: Settings) -> None:
    a = add_run(settings, {("fixed", "gsm8k"): [answer("q0", True)]})
    empty = add_run(settings, {})

    missing = client.get(f"/api/v1/runs/{a}/diff/99999")
    assert missing.status_code == 404 and "run 99999 does not exist" in missing.json()["detail"]
    arm = client.get(f"/api/v1/runs/{a}/diff/{a}", params={"arm_b": "stock"})
    assert arm.status_code == 422
    assert "no samples for arm 'stock'" in arm.json()["detail"] and "fixed" in arm.json()["detail"]
    nothing = client.get(f"/api/v1/runs/{a}/diff/{empty}")
    assert nothing.status_code == 422 and "stored no samples" in nothing.json()["detail"]


def test_reads_need_a_token_when_configured(settings: Settings) -> None:
    closed = settings.model_copy(update={"read_auth": True})
    with TestClient(create_app(closed)) as client:
        a = add_run(closed, {("fixed", "gsm8k"): [answer("q0", True)]})
        with session_scope(closed.resolved_database_url()) as session:
            viewer = create_token(session, "reader", Role.VIEWER)
        assert client.get(f"/api/v1/runs/{a}/diff/{a}").status_code == 401
        assert client.post("/login", data={"token": viewer}, follow_redirects=False).status_code == 303
        assert client.get(f"/api/v1/runs/{a}/diff/{a}").status_code == 200


def drift_output(tokens: list[int], lp: float) -> ArmOutput:
    top = [{t - 1: -3.0, t: lp, t + 1: -3.0} for t in tokens]
    return ArmOutput(tokens, [lp] * len(tokens), top, [{5: lp, 6: -3.0}] * 4, [lp] * 4)


def drift_sample(key: str, mine: ArmOutput, reference: ArmOutput | None) -> Sample:
    floor = compare(mine if reference is None else reference, mine if reference is None else reference)
    data = {"prompt_ids": [1, 2, 3], "arm": pack(mine), "floor": floor.as_dict(), "finite": True, "kl_tolerance": 0.01}
    if reference is not None:
        data |= {"drift": compare(reference, mine).as_dict(), "reference": pack(reference)}
    else:
        data["drift"] = None
    return Sample(key=key, prompt_hash=f"h-{key}", target="", response="", prompt=f"prompt {key}", data=data)


def test_drift_rows_diff_by_first_divergence_and_page_shows_worst_first(client: TestClient, settings: Settings) -> None:
    """Drift samples (both arms' tokens and logprobs in `data`) through the store, the diff and the page."""
    ref = {k: drift_output([10, 20, 30, 40], -0.1) for k in ("p0", "p1", "p2")}
    cand = {
        "p0": drift_output([10, 20, 30, 40], -0.1),
        "p1": drift_output([10, 20, 31, 41], -0.6),
        "p2": drift_output([10, 25, 99, 98], -0.1),
    }
    stock = [drift_sample(k, ref[k], None) for k in ref]
    fixed = [drift_sample(k, cand[k], ref[k]) for k in ref]
    run = add_run(settings, {("stock", "drift"): stock, ("fixed", "drift"): fixed}, arms=["stock", "fixed"])

    diff = client.get(f"/api/v1/runs/{run}/diff/{run}", params={"arm_a": "stock", "arm_b": "fixed"}).json()
    [suite] = diff["suites"]
    assert suite["kind"] == "drift" and suite["kinds"] == ["drift"]
    drift = suite["drift"]
    assert (drift["matched"], drift["diverged"], drift["violations"]) == (3, 2, 1)
    assert [(c["key"], c["first_divergence"], c["close"]) for c in drift["changes"]] == [
        ("p2", 1, False),
        ("p1", 2, True),
    ]

    samples = client.get(f"/api/v1/runs/{run}/samples", params={"suite": "drift", "arm": "fixed"}).json()["items"]
    assert [s["key"] for s in samples][2] == "p0"  # diverged rows first
    assert {s["key"]: s["data"]["reference"]["tokens"] for s in samples}["p2"] == [10, 20, 30, 40]
    page = client.get(f"/runs/{run}/samples", params={"suite": "drift", "arm": "fixed"})
    assert page.status_code == 200, page.text
    assert page.text.count(' first-divergence"') == 2 and "not close" in page.text


def test_samples_view_of_a_suite_whose_profile_names_its_metrics() -> None:
    """The generic lm-eval suite declares no metric (its profile's config names them): its samples
    show as its open kind, as do a no-longer-registered suite's, as items."""
    from service.dashboard.views import shown_kind

    shown = (shown_kind("lm-eval").name, shown_kind("wer").name, shown_kind("gone").name)
    assert shown == ("accuracy", "wer", "accuracy")


def test_lm_eval_metrics_of_two_kinds_diff_side_by_side(client: TestClient, settings: Settings) -> None:
    """An lm-eval task scored by exact match (0/1), F1 (a number per item) and corpus BLEU: each
    metric's kind diffs it, and the compare page shows every section."""
    em, f1, bleu = "t:exact_match,none", "t:f1,none", "t:bleu,none"

    def item(key: str, right: bool, score: float) -> Sample:
        data = {"mean": {f1: score}, "corpus": {bleu: ["a b c d", "a b c d" if score else "x"]}}
        return Sample(key=key, prompt_hash="h", target="7", response=f"r{score}", correct={em: right}, data=data)

    runs = []
    for scores in ([1.0, 0.5, 0.25], [1.0, 0.75, 0.0]):
        with session_scope(settings.resolved_database_url()) as session:
            run = Run(profile="fixture", status="passed", trigger="ci", arms=[])
            session.add(run)
            session.flush()
            rows = [item(f"t-{i}", s == 1.0, s) for i, s in enumerate(scores)]
            store.save_samples(session, run.id, "fixed", "lm-eval", f1, rows)
            runs.append(run.id)
    a, b = runs
    [suite] = client.get(f"/api/v1/runs/{a}/diff/{b}").json()["suites"]
    assert suite["kinds"] == ["corpus", "accuracy", "mean"] and suite["wer"] is None
    [corpus] = suite["corpus"]
    assert (corpus["metric"], corpus["matched"], corpus["value_a"]) == (bleu, 3, pytest.approx(100))
    assert corpus["value_b"] < 100
    [mean] = suite["mean"]
    assert (mean["metric"], mean["matched"], mean["lower"], mean["higher"]) == (f1, 3, 1, 1)
    assert [c["key"] for c in mean["changes"]] == ["t-2", "t-1"]  # -0.25 before +0.25: falls first
    assert [m["metric"] for m in suite["accuracy"]] == [em]
    page = client.get(f"/compare/{a}/{b}")
    assert page.status_code == 200 and 'class="flips mean-changes"' in page.text and "0.2500 → 0.0000" in page.text
    assert f'<tr data-metric="{bleu}">' in page.text
    samples = client.get(f"/api/v1/runs/{b}/samples", params={"suite": "lm-eval"}).json()["items"]
    assert [s["key"] for s in samples] == ["t-2", "t-1", "t-0"]  # the lowest score first
