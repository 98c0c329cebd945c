// Profile page, admin only: save a baseline row through PUT /api/v1/baselines, then reload
// so the table, the chart band and the history all show the change.
"use strict";
(() => {
  const result = document.getElementById("admin-result");
  const numberOrNull = (text) => (text.trim() === "" ? null : Number(text));

  for (const form of document.querySelectorAll("form.baseline-edit")) {
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const data = new FormData(form);
      const body = {
        profile: form.dataset.profile, suite: form.dataset.suite, metric: form.dataset.metric,
        value: numberOrNull(data.get("value")),
        tolerance_kind: data.get("tolerance_kind"),
        tolerance: Number(data.get("tolerance")),
        reference_run_id: numberOrNull(data.get("reference_run_id")),
        source: data.get("source"),
      };
      const res = await fetch("/api/v1/baselines", {
        method: "PUT", credentials: "same-origin",
        headers: { "Content-Type": "application/json", Accept: "application/json", ...kvc.csrfHeader() },
        body: JSON.stringify(body),
      });
      if (res.ok) {
        location.reload();
        return;
      }
      const detail = await res.json().then((b) => b.detail).catch(() => res.statusText);
      result.hidden = false;
      result.className = "notice error";
      result.textContent = `Not saved: ${typeof detail === "string" ? detail : JSON.stringify(detail)}`;
    });
  }
})();
