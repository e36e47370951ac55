// Run page: charts of the run's timeline (uPlot), the warmup shaded and
// events marked; while the run is live, the figures and charts are fetched
// again every second. Every value is set as text (uPlot does so too).
"use strict";
(function () {
  const root = document.getElementById("run");
  if (!root || typeof uPlot === "undefined") return;
  const chartsEl = document.getElementById("charts");
  const palette = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"];
  const eventColor = { run_start: "#2ca02c", run_end: "#d62728", warmup_end: "#7f7f7f", eval: "#1f77b4", advice: "#ff7f0e", budget_alert: "#9467bd", price_alert: "#e377c2" };

  // Each chart: a title with its unit and scope, and the series it draws.
  const charts = [
    { id: "power", title: "Power (W): all the run's GPUs, and each GPU (whole GPU)", pick: (n) => n === "power_w" || /^power_w:.+\/gpu\d+$/.test(n) },
    { id: "energy", title: "Energy (J), cumulative, warmup included, all GPUs", pick: (n) => n === "energy_j" },
    { id: "tokps", title: "Tokens per second, all ranks", pick: (n) => n === "tok_per_s" },
    { id: "jtok", title: "J/token within each second, all GPUs", pick: (n) => n === "j_per_token" },
    { id: "vram", title: "VRAM peak (MiB), highest of the run's GPUs", pick: (n) => n === "vram_peak_mib" },
    { id: "wait", title: "Data wait vs compute (rank-seconds per second, summed over ranks)", pick: (n) => n === "data_wait_s" || n === "compute_s" },
  ];
  const plots = {};
  let last = null;

  function label(name) {
    if (name === "power_w") return "total";
    const m = /^power_w:(.+)$/.exec(name);
    return m ? m[1] : name;
  }

  // uPlot wants one x array per chart: join the series on their times.
  function chartData(series) {
    const tables = series.map((s) => [s.t_unix_ms.map((t) => t / 1000), s.values]);
    return tables.length === 1 ? tables[0] : uPlot.join(tables);
  }

  // The warmup shaded, events as vertical lines: drawn under the series.
  function decorations() {
    return {
      drawClear: [(u) => {
        const tl = last;
        const ctx = u.ctx, top = u.bbox.top, h = u.bbox.height;
        ctx.save();
        if (tl.start_ms != null && tl.warmup_end_ms != null) {
          const x0 = u.valToPos(tl.start_ms / 1000, "x", true), x1 = u.valToPos(tl.warmup_end_ms / 1000, "x", true);
          ctx.fillStyle = "rgba(128,128,128,0.15)";
          ctx.fillRect(Math.max(x0, u.bbox.left), top, Math.max(0, Math.min(x1, u.bbox.left + u.bbox.width) - Math.max(x0, u.bbox.left)), h);
        }
        for (const e of tl.events) {
          const x = u.valToPos(e.t_unix_ms / 1000, "x", true);
          if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) continue;
          ctx.strokeStyle = eventColor[e.kind] || "#333";
          ctx.setLineDash([4, 3]);
          ctx.beginPath(); ctx.moveTo(x, top); ctx.lineTo(x, top + h); ctx.stroke();
        }
        ctx.restore();
      }],
    };
  }

  // The events table, from the same answer as the charts (one read of the
  // run's windows per refresh), every value set as text.
  function events(tl) {
    const body = document.getElementById("events-body");
    if (!body) return;
    const rows = tl.events.map((e) => {
      const tr = document.createElement("tr");
      tr.className = "ev-" + e.kind;
      for (const text of [new Date(e.t_unix_ms).toISOString().replace(".000Z", "Z"), e.kind, e.node, e.text]) {
        const td = document.createElement("td");
        td.textContent = text;
        tr.appendChild(td);
      }
      return tr;
    });
    if (!rows.length) {
      const tr = document.createElement("tr"), td = document.createElement("td");
      td.colSpan = 4;
      td.className = "empty";
      td.textContent = "No events.";
      tr.appendChild(td);
      rows.push(tr);
    }
    body.replaceChildren(...rows);
  }

  function draw(tl) {
    last = tl;
    events(tl);
    const loading = document.getElementById("charts-loading");
    if (loading) loading.remove();
    const width = Math.max(320, chartsEl.clientWidth - 8);
    for (const c of charts) {
      const series = tl.series.filter((s) => c.pick(s.name));
      const box = document.getElementById("chart-" + c.id) || (() => {
        const fig = document.createElement("figure");
        fig.id = "chart-" + c.id;
        fig.className = "chart";
        chartsEl.appendChild(fig);
        return fig;
      })();
      const data = series.length ? chartData(series) : [[]];
      const points = series.reduce((n, s) => n + s.values.length, 0);
      box.dataset.points = String(points);
      box.dataset.series = series.map((s) => s.name).join(",");
      const old = plots[c.id];
      if (old && old._names === box.dataset.series) { old.setData(data); continue; }
      if (old) old.destroy();
      box.textContent = "";
      if (!series.length) {
        const p = document.createElement("p");
        p.className = "hint";
        p.textContent = c.title + ": no data.";
        box.appendChild(p);
        delete plots[c.id];
        continue;
      }
      const opts = {
        title: c.title, width, height: 220,
        scales: { x: { time: true } },
        series: [{}].concat(series.map((s, i) => ({ label: label(s.name), stroke: palette[i % palette.length], width: s.name === "power_w" ? 2 : 1, spanGaps: false }))),
        axes: [{}, { size: 60 }],
        hooks: decorations(),
        cursor: { drag: { x: true, y: false } },
      };
      const u = new uPlot(opts, data, box);
      u._names = box.dataset.series;
      plots[c.id] = u;
    }
    chartsEl.dataset.loaded = "true";
  }

  async function loadTimeline() {
    const resp = await fetch(root.dataset.timeline, { credentials: "same-origin", cache: "no-store" });
    if (!resp.ok) throw new Error("timeline: HTTP " + resp.status);
    return resp.json();
  }

  async function refreshSummary() {
    const resp = await fetch(root.dataset.summary, { credentials: "same-origin", cache: "no-store" });
    if (!resp.ok) throw new Error("summary: HTTP " + resp.status);
    const tpl = document.createElement("template");
    tpl.innerHTML = await resp.text();
    const el = document.getElementById("summary");
    const open = document.getElementById("report-fields")?.open;
    el.replaceChildren(tpl.content);
    if (open) document.getElementById("report-fields").open = true;
  }

  let timer = null;
  const updated = document.getElementById("updated");
  // The figures are cheap (one report); the timeline of a long run is not
  // (a 24 h run reads 86,400 windows): it is asked for again only after 5
  // times as long as its last answer took, at least every second, so that
  // an open tab costs the collector at most a fifth of a core.
  let timelineAt = 0, timelineCost = 0;
  async function tick() {
    if (document.hidden && last) return;
    const asked = Date.now();
    try {
      let ended = root.dataset.ended === "true";
      if (!last || asked - timelineAt >= Math.max(1000, 5 * timelineCost)) {
        const tl = await loadTimeline();
        timelineAt = asked;
        timelineCost = Date.now() - asked;
        draw(tl);
        ended = tl.ended;
      }
      if (!ended || root.dataset.ended !== "true") await refreshSummary();
      // The summary says when the run ended; the charts get their last
      // points with the next timeline answer.
      const now = document.getElementById("status");
      if (now && now.textContent !== "live" && !ended) timelineAt = 0;
      root.dataset.ended = String(ended);
      root.classList.remove("stale");
      root.dataset.updatedMs = String(asked);
      if (updated) updated.textContent = ended ? "" : "live: updated " + new Date(asked).toISOString().slice(11, 19) + " UTC, every second";
      if (ended && timer) { clearInterval(timer); timer = null; }
    } catch (e) {
      root.classList.add("stale");
    }
  }
  tick();
  if (root.dataset.ended !== "true") timer = setInterval(tick, Number(root.dataset.pollMs) || 1000);
  window.addEventListener("resize", () => {
    const width = Math.max(320, chartsEl.clientWidth - 8);
    for (const u of Object.values(plots)) u.setSize({ width, height: 220 });
  });
})();
