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

  // Each chart: a title with its unit and scope, the series it draws, and
  // the unit its legend writes after a value.
  const charts = [
    { id: "power", unit: "W", title: "Power (W): all the run's GPUs, and each GPU (whole GPU)", pick: (n) => n === "power_w" || /^power_w:.+\/gpu\d+$/.test(n) },
    { id: "energy", unit: "J", title: "Energy (J), cumulative, warmup included, all GPUs", pick: (n) => n === "energy_j" },
    { id: "tokps", unit: "tok/s", title: "Tokens per second, all ranks", pick: (n) => n === "tok_per_s" },
    { id: "jtok", unit: "J/token", title: "J/token within each second, all GPUs", pick: (n) => n === "j_per_token" },
    { id: "vram", unit: "MiB", title: "VRAM peak (MiB), highest of the run's GPUs", pick: (n) => n === "vram_peak_mib" },
    { id: "wait", unit: "s/s", title: "Data wait vs compute (rank-seconds per second, summed over ranks)", pick: (n) => n === "data_wait_s" || n === "compute_s" },
  ];
  const eventName = { run_start: "start", run_end: "end", warmup_end: "warmup end", eval: "eval", advice: "advice", budget_alert: "budget", price_alert: "price" };
  const plots = {};
  let last = null;

  function label(name) {
    if (name === "power_w") return "total";
    const m = /^power_w:(.+)$/.exec(name);
    return m ? m[1] : name;
  }

  // fmt writes a figure as the console's tables do (numfmt in Go): four
  // significant digits, no exponent, no trailing zeros, whole numbers kept
  // whole.
  function fmt(v) {
    if (v == null || !isFinite(v)) return "—";
    if (v === 0) return "0";
    const a = Math.abs(v);
    if (a < 1e-6 || a >= 1e15) return v.toExponential(3);
    const r = Number(v.toPrecision(4));
    const decimals = 3 - Math.floor(Math.log10(Math.abs(r)));
    return decimals <= 0 ? String(Math.round(v)) : r.toFixed(decimals).replace(/\.?0+$/, "");
  }

  // A tick on a value axis: its round value, no trailing zeros.
  function tickLabel(v) {
    return v == null ? "" : String(Number(v.toPrecision(6)));
  }

  // The time axis is the time since the run's start, in s, min or h as the
  // range shown asks, ticks on whole seconds, minutes or hours: "20 s";
  // "2 min", "2:30" (min:s); "3 h", "3:30" (h:min).
  const timeIncrs = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400];
  function elapsed(s, span) {
    s = Math.round(s);
    if (span < 120) return s + " s";
    if (span < 7200) return s % 60 === 0 ? s / 60 + " min" : Math.floor(s / 60) + ":" + String(s % 60).padStart(2, "0");
    return s % 3600 === 0 ? s / 3600 + " h" : Math.floor(s / 3600) + ":" + String(Math.floor((s % 3600) / 60)).padStart(2, "0");
  }
  function elapsedLong(s) {
    if (s < 120) return fmt(s) + " s";
    if (s < 7200) return Math.floor(s / 60) + " min " + Math.floor(s % 60) + " s";
    return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
  }

  // uPlot wants one x array per chart: join the series on their times, as
  // seconds since the run's start. A null (missing windows) stays null and
  // breaks the line; a time only another series has is undefined, which
  // the line spans.
  // The x range is the run's, start to end: an x-only table puts both in.
  function chartData(series, t0, t1) {
    const tables = series.map((s) => [s.t_unix_ms.map((t) => (t - t0) / 1000), s.values]);
    return uPlot.join(tables.concat([[[0, Math.max(0, (t1 - t0) / 1000)]]]));
  }

  // The value a series' legend shows: at the cursor, or where the series
  // has no point at that time, its nearest point before it; with no cursor,
  // its last point. A break (missing windows) reads "no data".
  function legendValue(unit) {
    return (u, raw, si, idx) => {
      const ys = u.data[si];
      let i = idx == null ? ys.length - 1 : idx;
      if (idx != null && raw === null) return "no data";
      while (i > 0 && ys[i] === undefined) i--;
      const v = ys[i];
      return v == null ? "no data" : fmt(v) + " " + unit;
    };
  }

  const axisFont = "12px system-ui, sans-serif";
  const measure = document.createElement("canvas").getContext("2d");
  measure.font = axisFont;
  // A y axis as wide as its widest label: a label is never cut off.
  function axisSize(u, values) {
    const w = Math.max(0, ...(values || []).map((v) => measure.measureText(v || "").width));
    return Math.ceil(w) + 10 + 8; // tick 10, gap 8 (uPlot's defaults)
  }

  // The warmup shaded, events as vertical lines: drawn under the series.
  // Each event also gets a label above the plot (eventLabels).
  function decorations(t0) {
    return {
      drawClear: [(u) => {
        const tl = last;
        const ctx = u.ctx, top = u.bbox.top, h = u.bbox.height;
        ctx.save();
        if (tl.start_ms != null && tl.warmup_end_ms != null) {
          const x0 = u.valToPos((tl.start_ms - t0) / 1000, "x", true), x1 = u.valToPos((tl.warmup_end_ms - t0) / 1000, "x", true);
          ctx.fillStyle = "rgba(128,128,128,0.15)";
          ctx.fillRect(Math.max(x0, u.bbox.left), top, Math.max(0, Math.min(x1, u.bbox.left + u.bbox.width) - Math.max(x0, u.bbox.left)), h);
        }
        for (const e of tl.events) {
          const x = u.valToPos((e.t_unix_ms - t0) / 1000, "x", true);
          if (x < u.bbox.left - 1 || x > u.bbox.left + u.bbox.width + 1) continue;
          ctx.strokeStyle = eventColor[e.kind] || "#333";
          ctx.setLineDash([4, 3]);
          ctx.beginPath(); ctx.moveTo(x, top); ctx.lineTo(x, top + h); ctx.stroke();
        }
        ctx.restore();
      }],
      draw: [(u) => eventLabels(u, t0)],
    };
  }

  // Event labels: text in the plot's overlay, at the top of each event's
  // line, set as text; events closer than a label's width go one row down.
  function eventLabels(u, t0) {
    let layer = u.over.querySelector(".ev-labels");
    if (!layer) {
      layer = document.createElement("div");
      layer.className = "ev-labels";
      u.over.appendChild(layer);
    }
    const rows = [];
    const out = [];
    for (const e of last.events) {
      const x = u.valToPos((e.t_unix_ms - t0) / 1000, "x");
      if (!(x >= -1 && x <= u.over.clientWidth + 1)) continue;
      const el = document.createElement("span");
      el.className = "ev-label ev-" + e.kind;
      el.textContent = eventName[e.kind] || e.kind;
      el.title = e.text + " (" + new Date(e.t_unix_ms).toISOString().slice(11, 19) + " UTC)";
      out.push([el, x]);
    }
    layer.replaceChildren(...out.map(([el]) => el));
    for (const [el, x] of out) {
      const w = el.offsetWidth;
      // Kept inside the plot: a label at its right edge is drawn to the left.
      const left = Math.max(0, Math.min(x + 2, u.over.clientWidth - w));
      let row = rows.findIndex((end) => end <= left);
      if (row < 0) { row = rows.length; rows.push(0); }
      rows[row] = left + w + 4;
      el.style.left = left + "px";
      el.style.top = row * 15 + "px";
    }
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
      const t0 = tl.start_ms != null ? tl.start_ms : 0;
      const data = series.length ? chartData(series, t0, tl.end_ms != null ? tl.end_ms : t0) : [[]];
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
        padding: [16, 28, 0, 0],
        scales: { x: { time: false } },
        series: [{ label: "since start", value: (u, v) => v == null ? "—" : elapsedLong(v) + " · " + new Date(t0 + v * 1000).toISOString().slice(11, 19) + " UTC" }]
          .concat(series.map((s, i) => ({ label: label(s.name), stroke: palette[i % palette.length], width: s.name === "power_w" ? 2 : 1, spanGaps: false, value: legendValue(c.unit) }))),
        axes: [
          { font: axisFont, incrs: timeIncrs, space: 60, values: (u, splits) => splits.map((v) => elapsed(v, u.scales.x.max - u.scales.x.min)) },
          { font: axisFont, size: axisSize, values: (u, splits) => splits.map(tickLabel) },
        ],
        hooks: decorations(t0),
        cursor: { drag: { x: true, y: false } },
      };
      const u = new uPlot(opts, data, box);
      u._names = box.dataset.series;
      box.uplot = u; // for the page's tests, which read what it drew
      keyboard(box, u);
      plots[c.id] = u;
    }
    chartsEl.dataset.loaded = "true";
  }

  // A chart takes the keyboard: Tab to it, then ← and → move the cursor
  // from point to point (the legend shows the values there), Home and End
  // to the first and last, Escape hides it.
  function keyboard(box, u) {
    box.tabIndex = 0;
    box.setAttribute("aria-label", u.root.querySelector(".u-title")?.textContent + ": ← and → read the values");
    box.addEventListener("keydown", (ev) => {
      const xs = u.data[0], n = xs.length;
      if (!n) return;
      let i = u.cursor.idx;
      switch (ev.key) {
        case "ArrowRight": i = i == null ? 0 : Math.min(n - 1, i + 1); break;
        case "ArrowLeft": i = i == null ? n - 1 : Math.max(0, i - 1); break;
        case "Home": i = 0; break;
        case "End": i = n - 1; break;
        case "Escape": u.setCursor({ left: -10, top: -10 }); return;
        default: return;
      }
      ev.preventDefault();
      // uPlot takes the plot's right edge as outside it: one pixel in.
      u.setCursor({ left: Math.min(u.valToPos(xs[i], "x"), u.over.clientWidth - 1), top: u.over.clientHeight / 2 });
    });
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
