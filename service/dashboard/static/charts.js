// Profile page: one plotly trend chart per metric. Points are runs (error bars: their CI),
// coloured by verdict; the baseline and pass line in force at each run bound the shaded
// tolerance band, extended to today with the current baseline. A click opens the run.
// The "by release" charts draw the same over releases (a category axis, oldest first): a
// point is a release's latest decided run, and a click opens the release.
"use strict";
(() => {
  const COLOURS = {
    pass: "#1a7f37", warn: "#bf3989", fail: "#cf222e", inconclusive: "#9a6700", no_baseline: "#6e7781", none: "#8250df",
  };
  const LABELS = { none: "no verdict (A/B control)" };

  // Plotly renders hover text as HTML (links included); labels are anyone's text, so escape
  // them. Without `<` no tag can form; Plotly decodes these three entities and no others.
  const ENTITIES = { "&": "&amp;", "<": "&lt;", ">": "&gt;" };
  const escapeHtml = (text) => String(text).replace(/[&<>]/g, (c) => ENTITIES[c]);

  // A release names the x of its points (escaped: Plotly draws tick labels as HTML too).
  const xOf = (p) => (p.release !== undefined ? escapeHtml(p.release) : p.at);

  function bandTraces(s) {
    const withBand = s.points.filter((p) => p.baseline !== null && p.threshold !== null);
    const xs = withBand.map(xOf);
    const base = withBand.map((p) => p.baseline);
    const pass = withBand.map((p) => p.threshold);
    // hovers show the numbers as the server's reports write them (service.numbers)
    const baseText = withBand.map((p) => p.baseline_shown);
    const passText = withBand.map((p) => p.threshold_shown);
    const extend = (x) => {
      xs.push(x);
      base.push(s.current.value);
      pass.push(s.current.threshold);
      baseText.push(s.current.value_shown);
      passText.push(s.current.threshold_shown);
    };
    if (s.current) {  // the run charts only: extend the band to today
      if (!xs.length) extend(s.points.length ? s.points[0].at : new Date().toISOString());
      extend(new Date().toISOString());
    }
    if (!xs.length) return [];
    const line = { shape: "hv", width: 1.5 };
    return [
      { name: "pass line", x: xs, y: pass, text: passText, mode: "lines", line: { ...line, color: "#bf8700", dash: "dot" },
        hovertemplate: "pass line %{text}<extra></extra>" },
      { name: "baseline", x: xs, y: base, text: baseText, mode: "lines", line: { ...line, color: "#57606a" },
        fill: "tonexty", fillcolor: "rgba(191,135,0,0.12)", hovertemplate: "baseline %{text}<extra></extra>" },
    ];
  }

  function pointTraces(s) {
    const byVerdict = new Map();
    for (const p of s.points) {
      if (!byVerdict.has(p.verdict)) byVerdict.set(p.verdict, []);
      byVerdict.get(p.verdict).push(p);
    }
    const arms = new Set(s.points.map((p) => p.arm));
    return [...byVerdict].map(([verdict, pts]) => ({
      name: LABELS[verdict] || verdict.replaceAll("_", " "),
      x: pts.map(xOf),
      y: pts.map((p) => p.value),
      customdata: pts.map((p) => p.link || p.run_id),  // a run's id, or a release's page
      // the value as the server's reports write it (service.numbers): a KL of 4e-06 is not 0.0000
      text: pts.map((p) => escapeHtml(`run #${p.run_id}${arms.size > 1 ? ` arm ${p.arm}` : ""}${p.git_sha ? ` @ ${p.git_sha}` : ""}`)
        + `<br>${escapeHtml(p.shown)}`),
      mode: "markers",
      marker: { color: COLOURS[verdict] || COLOURS.none, size: 9, symbol: pts.map((p) => (p.arm === [...arms][0] ? "circle" : "diamond")) },
      error_y: {
        type: "data", symmetric: false, color: COLOURS[verdict] || COLOURS.none, thickness: 1, width: 3,
        array: pts.map((p) => (p.ci_high === null ? 0 : p.ci_high - p.value)),
        arrayminus: pts.map((p) => (p.ci_low === null ? 0 : p.value - p.ci_low)),
      },
      hovertemplate: `%{text} (${verdict.replaceAll("_", " ")})<br>%{x}<extra></extra>`,
    }));
  }

  function draw(series, attribute, xaxis) {
    series.forEach((s, index) => {
      const el = document.querySelector(`[${attribute}="${index}"]`);
      const layout = {
        title: { text: `${s.suite} · ${s.metric} (${s.direction} is better)`, font: { size: 14 } },
        margin: { l: 60, r: 20, t: 40, b: 40 },
        hovermode: "closest",
        xaxis,
        yaxis: { title: { text: s.metric }, tickformat: ".3f" },
        legend: { orientation: "h", y: -0.15 },
      };
      Plotly.newPlot(el, [...bandTraces(s), ...pointTraces(s)], layout, { displaylogo: false, responsive: true });
      el.on("plotly_click", (event) => {
        const target = event.points[0] && event.points[0].customdata;
        if (target) location.href = typeof target === "number" ? `/runs/${target}` : target;
      });
    });
  }

  draw(JSON.parse(document.getElementById("trend-data").textContent), "data-series", { type: "date" });
  const byRelease = JSON.parse(document.getElementById("release-trend-data").textContent);
  // Half a category of room each side, so the first and last labels are not cut at the edges.
  draw(byRelease.series, "data-release-series", {
    type: "category", categoryorder: "array", categoryarray: byRelease.releases.map(escapeHtml),
    range: [-0.5, byRelease.releases.length - 0.5], automargin: true, title: { text: byRelease.key },
  });
})();
