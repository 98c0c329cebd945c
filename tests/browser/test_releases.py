"""Release pages in headless Chromium against a real `kvcanary serve` on the release seed."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import pytest
from playwright.sync_api import Page, expect

from service.db.migrate import upgrade
from service.schemas import MAX_LABEL_VALUE
from tests.browser.conftest import Shoot, start_dashboard
from tests.browser.release_seed import BLOCKED, HOSTILE, KEY, PARTIAL, PREVIOUS, REQUIRED, SeededReleases, seed_releases
from tests.browser.seed import GSM8K, WHISPER
from tests.service.conftest import LiveService

pytestmark = pytest.mark.browser


@dataclass
class Releases:
    service: LiveService
    seeded: SeededReleases

    @property
    def url(self) -> str:
        return self.service.url


@pytest.fixture(scope="module")
def releases(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Releases]:
    data_dir = tmp_path_factory.mktemp("releases")
    database_url = f"sqlite:///{data_dir / 'kvcanary.db'}"
    upgrade(database_url)
    seeded = seed_releases(database_url)
    service = start_dashboard(data_dir, KVCANARY_RELEASE_REQUIRED_PROFILES=",".join(REQUIRED))
    try:
        yield Releases(service, seeded)
    finally:
        service.stop()


@pytest.fixture(scope="module")
def browser_context_args(releases: Releases) -> dict[str, Any]:
    """This module's pages are the release service's, not the shared dashboard's."""
    return {"base_url": releases.url}


def release_url(value: str) -> str:
    return f"/releases/{quote(f'{KEY}={value}', safe='=')}"


def test_a_release_with_one_failing_required_profile_reads_blocked_and_names_it(
    page: Page, releases: Releases, console_errors: list[str], shoot: Shoot
) -> None:
    page.goto(release_url(BLOCKED))
    state = page.locator("#release-state")
    expect(state).to_have_attribute("data-state", "blocked")
    expect(state.locator(".state-word")).to_have_text("blocked")
    expect(state).to_contain_text(f"{GSM8K} failed (run #{releases.seeded.runs[BLOCKED][GSM8K]})")
    expect(state).not_to_contain_text(WHISPER)
    expect(page.locator(".release-reasons")).to_have_count(0)  # one reason: the line above says it all
    gsm8k, whisper = (page.locator(f'tr.release-row[data-profile="{p}"]') for p in (GSM8K, WHISPER))
    expect(gsm8k).to_have_attribute("data-outcome", "failed")
    expect(whisper).to_have_attribute("data-outcome", "passed")
    expect(gsm8k.locator('tr.outcome[data-metric="gsm8k.strict-match"] .badge')).to_have_text("fail")
    expect(gsm8k.locator(".reason")).to_contain_text("gsm8k.strict-match 0.4250 (pass line 0.7911)")
    expect(gsm8k.locator("td.change")).to_contain_text(f"{releases.seeded.blocked_flips} right→wrong")
    shoot(page, "release-blocked")
    gsm8k.locator("a.diff-link").click()
    before, after = releases.seeded.runs[PREVIOUS][GSM8K], releases.seeded.runs[BLOCKED][GSM8K]
    expect(page).to_have_url(re.compile(rf"/compare/{before}/{after}$"))
    expect(page.locator("h1")).to_have_text("Compare runs")
    expect(page.locator("main")).to_contain_text("gsm8k-0120")  # right in the previous release, wrong here
    assert console_errors == []


def test_an_incomplete_release_names_what_has_not_run_and_compares_with_a_chosen_release(
    page: Page, releases: Releases, console_errors: list[str], shoot: Shoot
) -> None:
    page.goto(release_url(PARTIAL))
    state = page.locator("#release-state")
    expect(state).to_have_attribute("data-state", "incomplete")
    expect(state).to_contain_text(f"{WHISPER} is still running (run #{releases.seeded.queued_whisper})")
    gsm8k = page.locator(f'tr.release-row[data-profile="{GSM8K}"]')
    expect(gsm8k.locator("tr.outcome")).to_have_count(4)  # two metrics in each of two arms
    expect(gsm8k.locator('tr.outcome[data-arm="stock"] .chip.arm').first).to_have_text("stock")
    expect(gsm8k.locator("th, td").first).to_contain_text("required")
    expect(page.locator("#release-profiles thead")).to_contain_text(f"{KEY}={BLOCKED}")
    shoot(page, "release-incomplete")
    page.locator('select[name="previous"]').select_option(PREVIOUS)
    page.get_by_role("button", name="Compare").click()
    expect(page).to_have_url(re.compile(rf"previous={re.escape(PREVIOUS)}$"))
    expect(page.locator("#release-profiles thead")).to_contain_text(f"{KEY}={PREVIOUS}")
    assert console_errors == []


def test_the_list_and_a_value_with_markup_show_it_as_text(
    page: Page, releases: Releases, console_errors: list[str], shoot: Shoot
) -> None:
    page.goto("/releases")
    rows = page.locator("#releases tbody tr")
    expect(rows).to_have_count(4)
    expect(rows.first).to_have_attribute("data-state", "ready")
    expect(page.locator(f'#releases tr[data-release="{BLOCKED}"] .badge')).to_have_text("blocked")
    shoot(page, "releases")
    rows.first.get_by_role("link").click()
    expect(page.locator("h1 .release-name")).to_have_text(f"{KEY}={HOSTILE}")
    expect(page.locator("h1 b")).to_have_count(0)
    expect(page.locator("#release-state")).to_have_attribute("data-state", "ready")
    expect(page.locator("tr.release-row")).to_have_count(3)  # two required profiles and one that is not
    assert console_errors == []


def test_no_runs_for_a_release_or_a_key_is_a_404_empty_state(page: Page, releases: Releases) -> None:
    response = page.goto(release_url("9.9.9"))
    assert response is not None and response.status == 404
    expect(page.locator("#release-problem")).to_contain_text(f"no run is labelled {KEY}=9.9.9")
    page.get_by_role("link", name=BLOCKED, exact=True).click()
    expect(page.locator("#release-state")).to_have_attribute("data-state", "blocked")
    response = page.goto("/releases?key=no_such_key")
    assert response is not None and response.status == 404
    expect(page.locator("#releases-problem")).to_contain_text("No run carries a label 'no_such_key'")


def test_the_profile_page_draws_each_metric_over_releases(
    page: Page, releases: Releases, console_errors: list[str], shoot: Shoot
) -> None:
    page.goto(f"/profiles/{GSM8K}")
    charts = page.locator(".release-trend")
    expect(charts).to_have_count(2)  # strict-match and flexible-extract
    expect(charts.first.locator(".scatterlayer")).to_be_attached()
    ticks = charts.first.locator(".xtick text")
    expect(ticks).to_have_count(4)
    assert ticks.all_text_contents() == [PREVIOUS, BLOCKED, PARTIAL, HOSTILE], "oldest first, the value as text"
    expect(charts.first.locator(".legendtext", has_text="baseline")).to_have_count(1)
    charts.first.scroll_into_view_if_needed()
    shoot(page, "profile-by-release")
    assert console_errors == []


LONG_KEY = "build_tag"


def test_a_512_character_release_value_keeps_the_index_columns(
    page: Page, releases: Releases, console_errors: list[str], shoot: Shoot
) -> None:
    """One release value of 512 characters without a space once pushed every other column of the
    index off the screen and made its row a screen high; it is shortened, whole on hover."""
    from service.db.models import Run, utcnow
    from service.db.session import session_scope

    long_value = "0.99.0+" + "x" * (MAX_LABEL_VALUE - 7)
    with session_scope(releases.service.database_url) as session:
        for value in ("short-1", long_value):
            session.add(
                Run(
                    profile=GSM8K, status="passed", trigger="ci", triggered_by="ci", triggered_role="ci",
                    labels={LONG_KEY: value}, created_at=utcnow(), verdict="pass",
                )
            )  # fmt: skip
    page.set_viewport_size({"width": 1280, "height": 800})
    page.goto(f"/releases?key={LONG_KEY}")
    table = page.locator("#releases")
    expect(table).to_be_visible()
    assert (table.bounding_box() or {"width": 1e9})["width"] <= 1280, "the table fits the window"
    for header in page.locator("#releases thead th").all():
        box = header.bounding_box()
        assert box is not None and box["width"] > 30 and box["x"] + box["width"] <= 1280, header.inner_text()
    long_row = page.locator(f'#releases tr[data-release="{long_value}"]')
    short_row = page.locator('#releases tr[data-release="short-1"]')
    long_box, short_box = long_row.bounding_box(), short_row.bounding_box()
    assert long_box is not None and short_box is not None
    assert long_box["height"] < 3 * short_box["height"], "the long row is not a screen high"
    link = long_row.locator("td.release-value a")
    expect(link).to_have_attribute("title", long_value)
    assert len(link.inner_text()) <= 48
    shoot(page, "releases-index-512-character-value")
    assert console_errors == []
