// Runs page: refresh status, verdict, progress and duration of the listed runs without a reload,
// from the JSON API with the page's own filters; say when newer runs arrived.
"use strict";
(() => {
  const table = document.getElementById("runs");
  if (!table) return;
  const live = new Set(JSON.parse(table.dataset.live));
  const shownTotal = Number(table.dataset.total);
  const note = document.getElementById("live-status");
  const newer = document.getElementById("new-runs");
  const fastMs = Number(table.dataset.pollMs || 2000);

  function rows() {
    return new Map([...table.querySelectorAll("tr[data-run-id]")].map((tr) => [Number(tr.dataset.runId), tr]));
  }

  function update(tr, run) {
    tr.dataset.status = run.status;
    kvc.setBadge(tr.querySelector("[data-status-badge]"), "s", run.status);
    kvc.setBadge(tr.querySelector("[data-verdict-badge]"), "v", run.verdict);
    const box = tr.querySelector("[data-progress]");
    box.hidden = !live.has(run.status);
    if (!box.hidden) kvc.renderProgress(box, run.progress);
    const cell = tr.querySelector("[data-duration]");
    if (run.duration_s !== null) cell.textContent = kvc.duration(run.duration_s);
    else if (run.started_at) cell.textContent = `${kvc.duration((Date.now() - Date.parse(run.started_at)) / 1000)} so far`;
  }

  async function tick() {
    const shown = rows();
    try {
      const page = await kvc.getJSON(table.dataset.api);
      for (const run of page.items) {
        const tr = shown.get(run.id);
        if (tr) update(tr, run);
      }
      const arrived = page.total - shownTotal;
      newer.hidden = arrived <= 0;
      if (arrived > 0) {
        newer.replaceChildren(`${arrived} run${arrived === 1 ? "" : "s"} arrived since this page loaded. `);
        const link = document.createElement("a");
        link.href = location.href;
        link.textContent = "Show them";
        newer.append(link);
      }
      note.textContent = `Live: updated ${new Date().toLocaleTimeString()}`;
    } catch (err) {
      note.textContent = `Live updates failed (${err.message}); retrying.`;
    }
    return [...rows().values()].some((tr) => live.has(tr.dataset.status));
  }

  kvc.poll(tick, fastMs, fastMs * 5);
})();
