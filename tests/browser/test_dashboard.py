"""Release managers' pages in headless Chromium against a real `kvcanary serve` and a seeded database."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Page, expect

from evals.numbers import format_number
from service.auth import Role
from service.db.migrate import upgrade
from service.db.models import Run
from service.db.session import session_scope
from service.runs import store
from tests.browser.conftest import Dashboard, Shoot, start_dashboard
from tests.browser.seed import FLIP_DOWN, FLIP_UP, GSM8K, GSM8K_BASELINE, WHISPER, WORSE_UTTERANCE, seed, set_progress
from tests.service.test_compare import drift_output, drift_sample

pytestmark = pytest.mark.browser

LIVE_WAIT_MS = 15_000  # the runs page polls every 2 s; two CPU cores may be busy


def test_every_page_loads_without_console_errors(
    page: Page, dashboard: Dashboard, console_errors: list[str], shoot: Shoot
) -> None:
    s = dashboard.seeded
    pages = {
        "runs": ("/runs", "Runs"),
        "runs-failed": ("/runs?status=failed", "Runs"),
        "run-candidate": (f"/runs/{s.candidate}", f"Run #{s.candidate}"),
        "run-collapse": (f"/runs/{s.collapse}", f"Run #{s.collapse}"),
        "run-error": (f"/runs/{s.errored}", f"Run #{s.errored}"),
        "run-running": (f"/runs/{s.running}", f"Run #{s.running}"),
        "samples-gsm8k": (f"/runs/{s.candidate}/samples", "Samples"),
        "samples-wer": (f"/runs/{s.wer_candidate}/samples", "Samples"),
        "profiles": ("/profiles", "Profiles"),
        "profile-gsm8k": (f"/profiles/{GSM8K}", f"Profile {GSM8K}"),
        "profile-whisper": (f"/profiles/{WHISPER}", f"Profile {WHISPER}"),
        "compare-gsm8k": (f"/compare/{s.reference}/{s.candidate}", "Compare runs"),
        "compare-wer": (f"/compare/{s.wer_reference}/{s.wer_candidate}", "Compare runs"),
        "compare-form": ("/compare", "Compare two runs"),
        "login": ("/login", "Log in"),
    }
    for name, (path, heading) in pages.items():
        response = page.goto(path)
        assert response is not None and response.status == 200, (path, response and response.status)
        # Each page runs under the strict policy: a blocked script or style would be a console error.
        assert "script-src 'self'; style-src 'self'" in response.headers["content-security-policy"]
        expect(page.locator("h1")).to_contain_text(heading)
        if name.startswith("profile-"):
            expect(page.locator(".trend .scatterlayer").first).to_be_attached()
        shoot(page, name)
    assert console_errors == []


def test_run_page_shows_verdict_engine_facts_and_links(page: Page, dashboard: Dashboard) -> None:
    s = dashboard.seeded
    page.goto(f"/runs/{s.candidate}")
    strict = page.locator('.metric[data-metric="gsm8k.strict-match"]')
    expect(strict.locator(".badge")).to_have_text("pass")
    api = httpx.get(f"{dashboard.url}/api/v1/runs/{s.candidate}").json()
    explanation = next(m for m in api["metrics"] if m["metric"] == "strict-match")["explanation"]
    assert "McNemar" in explanation, "the reference run makes this a paired judgement"
    expect(strict.locator(".explanation")).to_have_text(explanation)
    expect(page.locator(".engine")).to_contain_text("NVIDIA GB200")
    served = page.locator(".engine .served-model").first
    expect(served).to_contain_text("/models/gsm8k-tiny")
    expect(served).to_contain_text("max_model_len 2048")
    expect(served).not_to_contain_text("permission")  # fields, not the answer's dict
    expect(page.locator(".receipt").first).to_contain_text("kernels.unified_attention.unified_attention")
    expect(page.locator("#timings")).to_contain_text("fixed.engine_start_s")
    expect(page.locator("#log-tail")).to_contain_text("1319 requests done")
    expect(page.locator("#promote")).to_have_count(0)  # promoting needs an admin login
    page.get_by_role("link", name=f"Diff with reference run #{s.reference}").click()
    expect(page).to_have_url(re.compile(rf"/compare/{s.reference}/{s.candidate}$"))
    page.goto(f"/runs/{s.errored}")
    expect(page.locator("#run-error")).to_contain_text("CUDA out of memory")


def test_trend_chart_draws_points_and_baseline(page: Page, dashboard: Dashboard, console_errors: list[str]) -> None:
    s = dashboard.seeded
    page.goto(f"/profiles/{GSM8K}")
    chart = page.locator("#trend-gsm8k-strict-match")
    expect(chart.locator(".scatterlayer")).to_be_attached()
    traces = chart.evaluate("el => el.data.map(t => ({name: t.name, y: t.y, ids: t.customdata || []}))")
    by_name = {t["name"]: t for t in traces}
    assert set(by_name) >= {"baseline", "pass line", "pass", "fail"}, by_name.keys()
    baseline = GSM8K_BASELINE.value
    assert baseline is not None and set(by_name["baseline"]["y"]) == {baseline}
    assert {round(y, 4) for y in by_name["pass line"]["y"]} == {round(baseline - GSM8K_BASELINE.tolerance, 4)}
    hover_texts = chart.evaluate("el => el.data.find(t => t.name === 'baseline').text")
    assert set(hover_texts) == {format_number(baseline)}  # hovers write numbers as every report does
    plotted = sorted(run_id for t in traces for run_id in t["ids"])
    assert plotted == sorted(s.gsm8k_points)
    assert by_name["fail"]["ids"] == [s.collapse]
    # drawn, not only configured: one SVG marker per run, the baseline as a line, CI bars
    assert chart.locator(".scatterlayer .points path.point").count() == len(s.gsm8k_points)
    assert chart.locator(".scatterlayer .js-line").count() >= 2
    assert chart.locator(".errorbar").count() == len(s.gsm8k_points)
    fail_colour = chart.locator(".scatterlayer .trace").nth(traces.index(by_name["fail"])).locator("path.point")
    assert "rgb(207, 34, 46)" in (fail_colour.get_attribute("style") or "")
    assert console_errors == []


def test_clicking_a_point_opens_its_run(page: Page, dashboard: Dashboard) -> None:
    s = dashboard.seeded
    page.goto(f"/profiles/{GSM8K}")
    chart = page.locator("#trend-gsm8k-strict-match")
    names = chart.evaluate("el => el.data.map(t => t.name)")
    point = chart.locator(".scatterlayer .trace").nth(names.index("fail")).locator("path.point").first
    point.scroll_into_view_if_needed()
    box = point.bounding_box()
    assert box is not None
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.move(x, y)
    expect(chart.locator(".hoverlayer .hovertext")).to_contain_text(f"run #{s.collapse}")
    page.mouse.click(x, y)
    expect(page).to_have_url(re.compile(rf"/runs/{s.collapse}$"))


def test_filters_and_paging(page: Page, dashboard: Dashboard, shoot: Shoot) -> None:
    total = httpx.get(f"{dashboard.url}/api/v1/runs", params={"limit": 1}).json()["total"]
    page.goto("/runs")
    rows = page.locator("#runs tbody tr[data-run-id]")
    expect(rows).to_have_count(50)
    expect(page.locator("[data-range]").first).to_have_text(f"1–50 of {total} runs")
    first_page = [int(x) for x in rows.evaluate_all("rs => rs.map(r => r.dataset.runId)")]
    assert first_page == sorted(first_page, reverse=True), "newest first"

    page.get_by_role("link", name="Next ›").first.click()
    expect(page.locator("[data-range]").first).to_have_text(f"51–100 of {total} runs")
    second_page = [int(x) for x in rows.evaluate_all("rs => rs.map(r => r.dataset.runId)")]
    assert max(second_page) < min(first_page)
    page.get_by_role("link", name="Last »").first.click()
    expect(rows).to_have_count(total - 100)

    page.goto("/runs")
    page.locator("select[name=status]").select_option("failed")
    page.locator("select[name=profile]").select_option(GSM8K)
    page.get_by_role("button", name="Filter").click()
    expect(page).to_have_url(re.compile(r"status=failed"))
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-run-id", str(dashboard.seeded.collapse))
    shoot(page, "runs-filtered")

    page.goto("/runs")
    page.locator("input[name=label]").fill("git_sha=d00d1e5")
    page.get_by_role("button", name="Filter").click()
    statuses = rows.evaluate_all("rs => rs.map(r => r.dataset.status)")
    assert sorted(statuses) == ["queued", "running"]


def test_live_progress_updates_without_reload(
    page: Page, dashboard: Dashboard, console_errors: list[str], shoot: Shoot
) -> None:
    with session_scope(dashboard.database_url) as session:
        run = Run(profile=GSM8K, status="running", trigger="ci", progress_done=5, progress_total=40)
        run.progress_phase = "gsm8k"
        session.add(run)
        session.flush()
        run_id = run.id
    page.goto("/runs")
    row = page.locator(f'tr[data-run-id="{run_id}"]')
    expect(row.locator("[data-progress-text]")).to_contain_text("5/40")
    page.evaluate("window.__sameDocument = true")

    set_progress(dashboard.database_url, run_id, 30)
    expect(row.locator("[data-progress-text]")).to_contain_text("30/40", timeout=LIVE_WAIT_MS)
    expect(row.locator("progress")).to_have_attribute("value", "30")
    shoot(page, "runs-live-progress")

    set_progress(dashboard.database_url, run_id, 40, status="passed")
    expect(row.locator("[data-status-badge]")).to_have_text("passed", timeout=LIVE_WAIT_MS)
    expect(row.locator("[data-verdict-badge]")).to_have_text("pass")
    expect(row.locator("[data-progress]")).to_be_hidden()
    assert page.evaluate("window.__sameDocument") is True, "the page must update in place, not reload"
    assert console_errors == []


def test_compare_view_shows_known_flips(page: Page, dashboard: Dashboard, shoot: Shoot) -> None:
    s = dashboard.seeded
    page.goto(f"/compare/{s.reference}/{s.candidate}")
    down = page.locator('table.flips[data-metric="strict-match"][data-direction="right-to-wrong"] tbody tr')
    up = page.locator('table.flips[data-metric="strict-match"][data-direction="wrong-to-right"] tbody tr')
    expect(down).to_have_count(1)
    expect(up).to_have_count(1)
    expect(down.first).to_have_attribute("data-key", FLIP_DOWN)
    expect(up.first).to_have_attribute("data-key", FLIP_UP)
    # side by side: the reference's right answer on the left, the candidate's wrong one on the right
    expect(down.first.locator("td.side-a pre")).to_contain_text("= 13 marbles")
    expect(down.first.locator("td.side-b pre")).to_contain_text("= 12 marbles")
    shoot(page, "compare-flip")

    page.goto(f"/compare/{s.wer_reference}/{s.wer_candidate}")
    first = page.locator("table.wer-changes tbody tr").first
    expect(first).to_have_attribute("data-key", WORSE_UTTERANCE)
    expect(first).to_contain_text("0 → 6")


def test_samples_wrong_first_search_and_paging(page: Page, dashboard: Dashboard) -> None:
    s = dashboard.seeded
    page.goto(f"/runs/{s.candidate}/samples")
    rows = page.locator("#samples tbody tr[data-key]")
    expect(rows).to_have_count(50)
    flags = rows.evaluate_all("rs => rs.map(r => r.dataset.correct)")
    wrong = flags.count("false")
    assert wrong > 0 and flags == ["false"] * wrong + ["true"] * (50 - wrong), "wrong answers first"
    page.locator("input[name=q]").fill("has 16 marbles")
    page.get_by_role("button", name="Apply").click()
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-key", FLIP_UP)
    page.goto(f"/runs/{s.candidate}/samples")
    page.get_by_role("link", name="Next ›").first.click()
    expect(page.locator("[data-range]").first).to_have_text("51–100 of 200 samples")

    headers = page.locator("#samples thead th").all_inner_texts()
    assert headers.index("Extracted") == headers.index("Target") + 1, "the extracted answer sits beside the target"

    page.goto(f"/runs/{s.wer_candidate}/samples")
    worst = page.locator("#samples tbody tr").first
    expect(worst).to_have_attribute("data-key", WORSE_UTTERANCE)
    expect(page.locator("#samples thead")).to_contain_text("S")
    # The seed's worst utterance has its first six words replaced by "mistake": six substitutions.
    substituted = worst.locator(".aligned.reference .w.substitute")
    expect(substituted).to_have_text(["the", "quick", "brown", "fox", "jumps", "over"])
    expect(worst.locator(".aligned.hypothesis .w.substitute")).to_have_count(6)
    expect(worst.locator(".aligned.hypothesis .w.equal")).to_have_count(6)
    expect(worst.locator(".aligned .w.delete, .aligned .w.insert")).to_have_count(0)


def test_login_form_when_reads_need_a_token(page: Page, tmp_path: Path, shoot: Shoot) -> None:
    closed = tmp_path / "closed"
    closed.mkdir()
    database_url = f"sqlite:///{closed / 'kvcanary.db'}"
    upgrade(database_url)
    seeded = seed(database_url)
    service = start_dashboard(closed, KVCANARY_READ_AUTH="true")
    try:
        viewer = service.token(Role.VIEWER, "release-manager")
        page.goto(f"{service.url}/profiles")
        expect(page).to_have_url(re.compile(r"/login\?next=/profiles$"))
        page.locator("#token").fill("kvc_not-a-token")
        page.get_by_role("button", name="Log in").click()
        expect(page.locator("#login-error")).to_contain_text("unknown or revoked")
        shoot(page, "login-rejected")
        page.locator("#token").fill(viewer)
        page.get_by_role("button", name="Log in").click()
        expect(page).to_have_url(f"{service.url}/profiles")
        expect(page.locator("header .who")).to_contain_text("release-manager")
        cookie = next(c for c in page.context.cookies() if c["name"] == "kvcanary_session")
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        assert cookie["value"] != viewer  # a session id, never the token itself
        page.goto(f"{service.url}/runs")
        expect(page.locator("#live-status")).to_contain_text("Live: updated", timeout=LIVE_WAIT_MS)
        page.goto(f"{service.url}/runs/{seeded.candidate}")
        expect(page.locator(".metric").first).to_be_visible()
        expect(page.locator("#promote")).to_have_count(0)  # a viewer reads; promoting needs admin
        page.get_by_role("button", name="Log out").click()
        page.goto(f"{service.url}/runs")
        expect(page).to_have_url(re.compile(r"/login"))
        copied = httpx.get(f"{service.url}/api/v1/runs", cookies={"kvcanary_session": cookie["value"]})
        assert copied.status_code == 401  # logout ended the session on the server, not only here
        page.goto(f"{service.url}/login?next=//evil.example.com/")
        page.locator("#token").fill(viewer)
        page.get_by_role("button", name="Log in").click()
        expect(page).to_have_url(f"{service.url}/runs")  # never sent off-site after a login
    finally:
        service.stop()


def test_admin_promotes_a_reference_and_edits_a_baseline(
    page: Page, dashboard: Dashboard, console_errors: list[str], shoot: Shoot
) -> None:
    s = dashboard.seeded
    admin = dashboard.service.token(Role.ADMIN, "rm-admin")
    page.goto(f"/login?next=/runs/{s.wer_candidate}")
    page.locator("#token").fill(admin)
    page.get_by_role("button", name="Log in").click()
    expect(page.locator("header .who")).to_contain_text("rm-admin")

    page.once("dialog", lambda dialog: dialog.accept())
    page.locator("#promote").click()
    expect(page.locator("#admin-result")).to_have_text("Reference run for wer.wer.")
    [baseline] = httpx.get(f"{dashboard.url}/api/v1/baselines", params={"profile": WHISPER}).json()
    assert baseline["reference_run_id"] == s.wer_candidate and baseline["updated_by"] == "rm-admin"

    page.goto(f"/profiles/{WHISPER}")
    form = page.locator('form.baseline-edit[data-metric="wer"]')
    form.locator("input[name=value]").fill("0.05")
    form.locator("input[name=source]").fill("re-measured on H200")
    form.get_by_role("button", name="Save").click()
    row = page.locator('#baselines tr[data-metric="wer.wer"]')
    expect(row).to_contain_text("0.0500")
    expect(row).to_contain_text("re-measured on H200")
    expect(page.locator("#history")).to_contain_text("value 0.045 → 0.05")
    chart = page.locator("#trend-wer-wer")
    baseline_y = chart.evaluate("el => el.data.find(t => t.name === 'baseline').y")
    assert baseline_y[-1] == 0.05, "the band reaches today at the new baseline"
    shoot(page, "profile-admin-edit")
    assert console_errors == []


def test_chart_hover_shows_label_html_as_text(page: Page, dashboard: Dashboard) -> None:
    """Labels are any CI token's text: a git_sha written as a link must hover as text."""
    s = dashboard.seeded
    hostile = '<a href="https://evil.example.com/">login here</a>'
    with session_scope(dashboard.service.database_url) as session:
        run = session.get(Run, s.collapse)
        assert run is not None
        original = dict(run.labels)
        run.labels = {**original, "git_sha": hostile}
    try:
        page.goto(f"/profiles/{GSM8K}")
        chart = page.locator("#trend-gsm8k-strict-match")
        names = chart.evaluate("el => el.data.map(t => t.name)")
        point = chart.locator(".scatterlayer .trace").nth(names.index("fail")).locator("path.point").first
        point.scroll_into_view_if_needed()
        box = point.bounding_box()
        assert box is not None
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        hover = chart.locator(".hoverlayer .hovertext")
        expect(hover).to_contain_text(hostile)
        assert hover.locator("a").count() == 0
    finally:
        with session_scope(dashboard.service.database_url) as session:
            row = session.get(Run, s.collapse)
            assert row is not None
            row.labels = original


def test_drift_samples_draw_token_strips_worst_first(
    page: Page, dashboard: Dashboard, console_errors: list[str], shoot: Shoot
) -> None:
    """A drift A/B run's candidate rows: tokens shaded by |Δ logprob|, the first divergence boxed."""
    ref = {k: drift_output([10, 20, 30, 40], -0.1) for k in ("p0", "p1", "p2")}
    cand = {
        "p0": drift_output([10, 20, 30, 40], -0.1),
        "p1": drift_output([10, 20, 31, 41], -1.1),
        "p2": drift_output([10, 25, 99, 98], -0.1),
    }
    with session_scope(dashboard.database_url) as session:
        run = Run(
            profile=GSM8K,
            status="passed",
            trigger="ci",
            arms=[{"name": v, "variant": v, "engine": {}} for v in ("stock", "fixed")],
        )
        session.add(run)
        session.flush()
        store.save_samples(session, run.id, "stock", "drift", "kl", [drift_sample(k, ref[k], None) for k in ref])
        store.save_samples(session, run.id, "fixed", "drift", "kl", [drift_sample(k, cand[k], ref[k]) for k in ref])
        run_id = run.id

    page.goto(f"/runs/{run_id}/samples?suite=drift&arm=fixed")
    rows = page.locator("#samples tbody tr[data-key]")
    expect(rows).to_have_count(3)
    assert rows.evaluate_all("rs => rs.map(r => r.dataset.key)")[2] == "p0", "diverged prompts first"
    p1 = page.locator('#samples tr[data-key="p1"]')
    expect(p1.locator(".tok.first-divergence")).to_have_text("31")
    shaded = p1.locator(".tok").nth(1).evaluate("t => getComputedStyle(t).backgroundColor")
    assert shaded == "rgb(220, 40, 40)", shaded  # |Δ| of 1 nat before the divergence: full colour
    unshaded = page.locator('#samples tr[data-key="p0"] .tok').first.evaluate(
        "t => getComputedStyle(t).backgroundColor"
    )
    assert unshaded == "rgba(220, 40, 40, 0)", unshaded
    expect(page.locator('#samples tr[data-key="p2"]')).to_contain_text("not close")
    shoot(page, "samples-drift")
    assert console_errors == []


def test_api_docs_render_from_the_service_alone(page: Page, dashboard: Dashboard, console_errors: list[str]) -> None:
    """Swagger UI and ReDoc come from the installed package, under the CSP: an offline host can use them."""
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    page.goto("/docs")
    expect(page.locator(".opblock-summary-path", has_text="/api/v1/runs/{run_id}/cancel")).to_be_visible()
    page.goto("/redoc")
    expect(page.get_by_role("heading", name=re.compile("^kvcanary"))).to_be_visible()
    expect(page.get_by_text("/api/v1/runs/{run_id}/cancel").first).to_be_attached()
    elsewhere = [url for url in requested if not url.startswith((dashboard.url, "data:", "blob:"))]
    assert elsewhere == [] and console_errors == []
