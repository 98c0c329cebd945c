// Shared helpers of the dashboard scripts: formatting the way the server does, and badges.
"use strict";
window.kvc = (() => {
  function duration(seconds) {
    if (seconds === null || seconds === undefined) return "—";
    const total = Math.round(seconds);
    const h = Math.floor(total / 3600), m = Math.floor((total % 3600) / 60), s = total % 60;
    const pad = (x) => String(x).padStart(2, "0");
    if (h) return `${h}h ${pad(m)}m`;
    if (m) return `${m}m ${pad(s)}s`;
    return `${s}s`;
  }

  function setBadge(el, kind, value) {
    if (!el) return;
    if (!value) {
      el.className = "muted";
      el.textContent = "—";
      return;
    }
    el.className = `badge ${kind}-${value}`;
    el.textContent = value.replaceAll("_", " ");
  }

  function renderProgress(container, p) {
    container.replaceChildren();
    if (p.total) {
      const bar = document.createElement("progress");
      bar.max = p.total;
      bar.value = p.done;
      container.append(bar);
    }
    const text = document.createElement("span");
    text.dataset.progressText = "";
    let words = p.phase || "waiting";
    if (p.total) words += ` ${p.done}/${p.total}`;
    if (p.eta_s !== null && p.eta_s !== undefined) words += ` · ETA ${duration(p.eta_s)}`;
    text.textContent = words;
    container.append(text);
  }

  // Changes made with the login cookie carry the page's CSRF token (see service/api/deps.py).
  function csrfHeader() {
    const meta = document.querySelector('meta[name="csrf-token"]');
    return meta && meta.content ? { "X-CSRF-Token": meta.content } : {};
  }

  async function getJSON(url) {
    const res = await fetch(url, { headers: { Accept: "application/json" }, credentials: "same-origin" });
    if (!res.ok) {
      let detail = res.statusText;
      try { detail = (await res.json()).detail || detail; } catch (_) { /* not JSON */ }
      throw new Error(`HTTP ${res.status}: ${detail}`);
    }
    return res.json();
  }

  // Poll `tick` every `fastMs` while it returns true (something is live), else every `slowMs`;
  // a hidden tab waits for the slow interval.
  function poll(tick, fastMs, slowMs) {
    async function loop() {
      let live = true;
      if (!document.hidden) live = await tick();
      setTimeout(loop, live && !document.hidden ? fastMs : slowMs);
    }
    setTimeout(loop, fastMs);
  }

  return { csrfHeader, duration, setBadge, renderProgress, getJSON, poll };
})();
