// Run page: follow a live run's progress and reload once it ends; the admin's promote button.
"use strict";
(() => {
  const box = document.getElementById("live-run");
  if (box) {
    const live = new Set(JSON.parse(box.dataset.live));
    const note = document.getElementById("live-status");
    kvc.poll(async () => {
      try {
        const run = await kvc.getJSON(box.dataset.api);
        kvc.setBadge(document.querySelector("h1 [data-status-badge]"), "s", run.status);
        kvc.renderProgress(box.querySelector("[data-progress]"), run.progress);
        if (!live.has(run.status)) {
          location.reload();
          return false;
        }
        note.textContent = `Live: updated ${new Date().toLocaleTimeString()}`;
      } catch (err) {
        note.textContent = `Live updates failed (${err.message}); retrying.`;
      }
      return true;
    }, Number(box.dataset.pollMs || 2000), 10000);
  }

  const promote = document.getElementById("promote");
  if (promote) {
    promote.addEventListener("click", async () => {
      if (!confirm("Make this run the reference run for every metric it reported?")) return;
      const result = document.getElementById("admin-result");
      const res = await fetch(promote.dataset.url, { method: "POST", credentials: "same-origin", headers: kvc.csrfHeader() });
      const body = await res.json().catch(() => ({}));
      result.hidden = false;
      result.className = res.ok ? "notice ok" : "notice error";
      result.textContent = res.ok
        ? `Reference run for ${body.map((b) => `${b.suite}.${b.metric}`).join(", ")}.`
        : `Not promoted: ${body.detail || res.statusText}`;
    });
  }
})();
