// Tandem dashboard: polls dashboard/data (ServingMetrics.snapshot()) every second and redraws
// hand-drawn <canvas> charts; no libraries. Every canvas carries data-points (points or bars drawn
// by its last redraw) and data-updated (how many redraws so far); <body data-updated> counts the
// snapshots received. Tests and curious people can read them.
"use strict";

const POLL_MS = 1000;
const MAX_POLL_MS = 10000; // while polls get no data, they back off to this
const MIN_SPAN_SECONDS = 30; // the x axis spans at least this much time
const PAD = { left: 58, right: 10, top: 10, bottom: 20 };
const DASHED = [5, 4];
const COLORS = {
  blue: "#2f6fde", orange: "#e8772e", green: "#1d9a5b", purple: "#8a4fd0",
  red: "#d23c3c", grey: "#8a93a6", teal: "#168f9c", grid: "#e3e6ec", ink: "#6b7385",
};

const pct = (v) => `${Math.round(v * 100)}%`;
const num = (v) => (Math.abs(v) >= 100 ? v.toFixed(0) : Math.abs(v) >= 10 ? v.toFixed(1) : v.toFixed(2));
// A number and its unit never part at a line's end (a tile's "0.42 s" left its "s" on a line of its own)
const secs = (v) => `${num(v)}\u00a0s`;
const ms = (v) => `${num(v)}\u00a0ms`;
const bytes = (v) => (v >= 2 ** 30 ? `${(v / 2 ** 30).toFixed(2)}\u00a0GiB` : `${(v / 2 ** 20).toFixed(0)}\u00a0MiB`);
const orDash = (v, format) => (v === null || v === undefined ? "–" : format(v));

const LINE_CHARTS = [
  { id: "chart-acceptance", yMin: 0, yMax: 1, format: pct, threshold: (s) => s.alert.threshold,
    series: [
      { key: "acceptance_rate", label: "per second", color: COLORS.blue },
      { key: "rolling_acceptance_rate", label: "rolling window", color: COLORS.orange },
    ] },
  { id: "chart-tokens", yMin: 0, format: num,
    series: [{ key: "tokens_per_s", label: "tokens/s", color: COLORS.green }] },
  { id: "chart-k", yMin: 0, format: num,
    series: [{ key: "mean_k", label: "mean k", color: COLORS.purple }] },
  { id: "chart-latency", yMin: 0, format: secs,
    series: [
      { key: "ttft_p50", label: "TTFT p50", color: COLORS.blue },
      { key: "ttft_p99", label: "TTFT p99", color: COLORS.blue, dash: DASHED },
      { key: "e2e_p50", label: "e2e p50", color: COLORS.orange },
      { key: "e2e_p99", label: "e2e p99", color: COLORS.orange, dash: DASHED },
    ] },
  { id: "chart-itl", yMin: 0, scale: 1000, format: ms,
    series: [
      { key: "itl_p50", label: "ITL p50", color: COLORS.teal },
      { key: "itl_p99", label: "ITL p99", color: COLORS.teal, dash: DASHED },
    ] },
  { id: "chart-utilization", yMin: 0, yMax: 1, format: pct,
    series: [
      { key: "utilization_target", label: "target (prefill + verify)", color: COLORS.red },
      { key: "utilization_draft", label: "draft", color: COLORS.green },
    ] },
  { id: "chart-queue", yMin: 0, format: num, counts: true,
    series: [
      { key: "running", label: "running", color: COLORS.blue },
      { key: "waiting", label: "waiting", color: COLORS.grey },
    ] },
];

// -- drawing -------------------------------------------------------------------------------------

function prepare(canvas) {
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth;
  const height = canvas.clientHeight;
  if (canvas.width !== Math.round(width * ratio) || canvas.height !== Math.round(height * ratio)) {
    canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(height * ratio);
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.clearRect(0, 0, width, height);
  ctx.font = "11px system-ui, sans-serif";
  return { ctx, box: { x0: PAD.left, x1: width - PAD.right, y0: height - PAD.bottom, y1: PAD.top } };
}

function niceMax(value) {
  if (!(value > 0)) return 1;
  const magnitude = 10 ** Math.floor(Math.log10(value));
  const step = [1, 2, 5, 10].find((m) => m * magnitude >= value);
  return step * magnitude;
}

const TICK_UNITS = new Map([[num, ""], [secs, " s"], [ms, " ms"]]);

// One axis's labels with one number of decimals, as few as its step needs: 0, 2.5, 5, 7.5, 10 s.
function tickLabel(format, value, step) {
  if (!TICK_UNITS.has(format)) return format(value);
  const decimals = [0, 1, 2, 3].find((d) => Math.abs(step * 10 ** d - Math.round(step * 10 ** d)) < 1e-6) ?? 3;
  return `${value.toFixed(decimals)}${TICK_UNITS.get(format)}`;
}

function drawYGrid(ctx, box, yMin, yMax, format) {
  ctx.strokeStyle = COLORS.grid;
  ctx.fillStyle = COLORS.ink;
  ctx.lineWidth = 1;
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  for (let i = 0; i <= 4; i += 1) {
    const value = yMin + ((yMax - yMin) * i) / 4;
    const y = box.y0 - ((box.y0 - box.y1) * i) / 4;
    ctx.beginPath();
    ctx.moveTo(box.x0, y);
    ctx.lineTo(box.x1, y);
    ctx.stroke();
    ctx.fillText(tickLabel(format, value, (yMax - yMin) / 4), box.x0 - 6, y);
  }
}

function finish(canvas, points) {
  canvas.dataset.points = String(points);
  canvas.dataset.updated = String(Number(canvas.dataset.updated || 0) + 1);
}

function drawLineChart(canvas, chart, snap) {
  const { ctx, box } = prepare(canvas);
  const times = snap.series.t || [];
  const scale = chart.scale || 1;
  const lines = chart.series.map((s) => (snap.series[s.key] || []).map((v) => (v === null ? null : v * scale)));
  const threshold = chart.threshold ? chart.threshold(snap) : null;
  const peak = Math.max(0, threshold || 0, ...lines.flat().filter((v) => v !== null));
  const yMin = chart.yMin;
  const nice = chart.yMax !== undefined ? chart.yMax : niceMax(peak * 1.1);
  const yMax = chart.counts ? Math.max(4, Math.ceil(nice / 4) * 4) : nice;  // whole requests on every tick
  const tMax = times.length ? times[times.length - 1] : 0;
  const tMin = times.length ? Math.min(times[0], tMax - MIN_SPAN_SECONDS) : -MIN_SPAN_SECONDS;
  const x = (t) => box.x0 + ((t - tMin) / (tMax - tMin)) * (box.x1 - box.x0);
  const y = (v) => box.y0 - ((Math.min(v, yMax) - yMin) / (yMax - yMin)) * (box.y0 - box.y1);
  drawYGrid(ctx, box, yMin, yMax, chart.format);
  ctx.textBaseline = "top";
  ctx.textAlign = "left";
  ctx.fillText(`-${Math.round(tMax - tMin)} s`, box.x0, box.y0 + 5);
  ctx.textAlign = "right";
  ctx.fillText("now", box.x1, box.y0 + 5);
  if (threshold !== null) {
    drawPath(ctx, [[box.x0, y(threshold)], [box.x1, y(threshold)]], COLORS.red, DASHED);
  }
  let points = 0;
  chart.series.forEach((s, i) => {
    const segments = [[]];
    lines[i].forEach((v, j) => {
      if (v === null) segments.push([]);
      else segments[segments.length - 1].push([x(times[j]), y(v)]);
    });
    segments.forEach((segment) => drawPath(ctx, segment, s.color, s.dash));
    points += lines[i].filter((v) => v !== null).length;
  });
  finish(canvas, points);
}

function drawPath(ctx, points, color, dash) {
  if (!points.length) return;
  ctx.strokeStyle = color;
  ctx.fillStyle = color;
  ctx.lineWidth = 2;
  ctx.setLineDash(dash || []);
  if (points.length === 1) {
    ctx.beginPath();
    ctx.arc(points[0][0], points[0][1], 2.5, 0, 2 * Math.PI);
    ctx.fill();
  } else {
    ctx.beginPath();
    points.forEach(([px, py], i) => (i ? ctx.lineTo(px, py) : ctx.moveTo(px, py)));
    ctx.stroke();
  }
  ctx.setLineDash([]);
}

function drawPositionBars(canvas, snap) {
  const { ctx, box } = prepare(canvas);
  const bars = snap.acceptance_by_position || [];
  drawYGrid(ctx, box, 0, 1, pct);
  const slot = (box.x1 - box.x0) / Math.max(bars.length, 1);
  const labelEvery = [1, 2, 4, 8, 16].find((n) => slot * n >= 18) ?? 16;  // deep copies: 64 positions
  ctx.textAlign = "center";
  bars.forEach((bar, i) => {
    const rate = bar.rate === null ? 0 : bar.rate;
    const left = box.x0 + i * slot + slot * 0.15;
    const top = box.y0 - rate * (box.y0 - box.y1);
    ctx.fillStyle = COLORS.blue;
    ctx.fillRect(left, top, slot * 0.7, box.y0 - top);
    ctx.fillStyle = COLORS.ink;
    ctx.textBaseline = "top";
    if (bar.position === 1 || bar.position % labelEvery === 0) {
      ctx.fillText(String(bar.position), left + slot * 0.35, box.y0 + 5);
    }
    ctx.textBaseline = "bottom";
    if (bar.rate !== null && slot > 24) ctx.fillText(pct(bar.rate), left + slot * 0.35, top - 2);
  });
  finish(canvas, bars.length);
}

// -- page ----------------------------------------------------------------------------------------

function buildLegends() {
  const entries = Object.fromEntries(LINE_CHARTS.map((c) => [c.id, c.series.slice()]));
  entries["chart-acceptance"].push({ label: "alert threshold", color: COLORS.red, dash: DASHED });
  entries["chart-positions"] = [{ label: "draft position (1 = first draft token)", color: COLORS.blue }];
  document.querySelectorAll(".legend").forEach((legend) => {
    (entries[legend.dataset.for] || []).forEach((s) => {
      const item = document.createElement("span");
      const swatch = document.createElement("i");
      swatch.style.background = s.dash
        ? `repeating-linear-gradient(90deg, ${s.color} 0 4px, transparent 4px 7px)` : s.color;
      item.append(swatch, s.label);
      legend.append(item);
    });
  });
}

function last(values) {
  for (let i = (values || []).length - 1; i >= 0; i -= 1) if (values[i] !== null) return values[i];
  return null;
}

// The newest value of the last `seconds` complete seconds: a tile of rounds goes blank once the
// engine idles, where last() kept showing the value of the last busy second however long ago.
function recent(values, seconds) {
  return last((values || []).slice(-seconds));
}

function renderTiles(snap) {
  const series = snap.series;
  const tiles = [
    ["rolling acceptance", orDash(snap.alert.rate, pct)],
    ["tokens/s (last second)", orDash(last(series.tokens_per_s), num)],
    ["mean k (last 5 s)", orDash(recent(series.mean_k, 5), num)],
    ["running / waiting", `${orDash(last(series.running), String)} / ${orDash(last(series.waiting), String)}`],
    ["TTFT p50 / p99", `${orDash(snap.latency.ttft.p50, secs)} / ${orDash(snap.latency.ttft.p99, secs)}`],
    ["ITL p50", orDash(snap.latency.itl.p50, (v) => ms(v * 1000))],
    ["e2e p99", orDash(snap.latency.e2e.p99, secs)],
    ["target / draft busy", `${pct(snap.utilization.target)} / ${pct(snap.utilization.draft)}`],
    ["requests done / rejected", `${snap.totals.requests} / ${snap.totals.rejected}`],
    ["prompt cache hits / host / disk tier", `${orDash(snap.prompt_cache.hit_rate, pct)} / ${bytes(snap.prompt_cache.host_bytes)} / ${bytes(snap.prompt_cache.disk_bytes)}`],
    ...Object.entries(snap.memory_bytes).map(([device, used]) => [`memory ${device}`, bytes(used)]),
  ];
  const container = document.getElementById("tiles");
  container.replaceChildren(...tiles.map(([label, value]) => {
    const tile = document.createElement("div");
    tile.className = "tile";
    tile.innerHTML = '<div class="label"></div><div class="value"></div>';
    tile.firstChild.textContent = label;
    tile.lastChild.textContent = value;
    return tile;
  }));
}

function renderAlert(alert) {
  const banner = document.getElementById("alert-banner");
  banner.hidden = !alert.firing;
  if (alert.firing) {
    banner.textContent = `Acceptance alert: the acceptance rate over the last ${alert.window_tokens} draft tokens`
      + ` is ${pct(alert.rate)}, below the threshold of ${pct(alert.threshold)}.`;
  }
}

function renderWorkers(workers) {
  const section = document.getElementById("workers");
  section.hidden = !(workers && workers.length);
  if (section.hidden) return;
  document.getElementById("worker-rows").replaceChildren(...workers.map((w) => {
    const row = document.createElement("tr");
    const state = w.alive ? "up" : w.restarting ? "restarting" : "down";  // down: out of restarts
    const placed = Object.entries(w.routed || {}).map(([reason, n]) => `${reason} ${n}`).join(", ") || "—";
    const rtt = w.rtt_ms < 10 ? w.rtt_ms.toPrecision(2) : w.rtt_ms.toFixed(0);  // 0.43 ms, 4.3 ms, 12 ms
    [w.name, w.role, state, w.pid ?? "—", w.sequences, placed, w.restarts, `${rtt} ms`].forEach((value) => {
      const cell = document.createElement("td");
      cell.textContent = String(value);
      row.appendChild(cell);
    });
    row.className = w.alive ? "up" : "down";
    return row;
  }));
}

function render(snap) {
  document.getElementById("model-name").textContent = snap.model_name;
  document.querySelectorAll(".recent-seconds").forEach((span) => { span.textContent = snap.recent_seconds; });
  renderAlert(snap.alert);
  renderTiles(snap);
  renderWorkers(snap.workers);
  LINE_CHARTS.forEach((chart) => drawLineChart(document.getElementById(chart.id), chart, snap));
  drawPositionBars(document.getElementById("chart-positions"), snap);
  document.body.dataset.updated = String(Number(document.body.dataset.updated) + 1);
}

let latest = null; // the last snapshot, redrawn on resize
let updatedAt = null; // when it came
let failures = 0; // polls in a row that got no snapshot: the next waits longer (up to MAX_POLL_MS)

// What the page shows is live, or why it is not: the notice says it where the charts are, and
// what is still drawn is dimmed as stale (it looked live with the server gone).
function setConnection(ok, why) {
  const status = document.getElementById("connection");
  const notice = document.getElementById("notice");
  status.className = ok ? "connection ok" : "connection";
  document.body.classList.toggle("stale", !ok && latest !== null);
  if (ok) {
    failures = 0;
    updatedAt = new Date();
    status.textContent = `live, updated ${updatedAt.toLocaleTimeString()}`;
    notice.hidden = true;
    return;
  }
  failures += 1;
  const shown = updatedAt ? `; showing what it said at ${updatedAt.toLocaleTimeString()}` : "";
  status.textContent = `not live${shown}`;
  notice.textContent = `${why}${shown}.`;
  notice.hidden = false;
}

// A server started with --protect-metrics wants its API key: add #key=KEY to the page's address,
// wherever a proxy serves it (the fragment never leaves the browser, so the key is in no server
// log or proxy). Read again when the address changes: no reload needed.
let apiKey = null;
function readKey() {
  apiKey = new URLSearchParams(location.hash.slice(1)).get("key");
}

// One poll's outcome: { snapshot } or { why } it has none. Only the fetch can fail for want of
// an answer; what the answer holds is judged apart (a proxy's page is no dead server).
async function fetchSnapshot() {
  const headers = apiKey ? { Authorization: `Bearer ${apiKey}` } : {};
  let response;
  try {
    response = await fetch("dashboard/data", { cache: "no-store", headers });
  } catch (error) {
    return { why: "The server does not answer; retrying" };
  }
  if (response.status === 401) {
    return { why: apiKey ? "The key in this page's address (#key=...) is not this server's API key"
      : "This server protects its metrics (--protect-metrics): add #key=YOUR_API_KEY to this page's address" };
  }
  if (!response.ok) {
    return { why: `The server answered HTTP ${response.status} (shutting down, or no engine left to serve); retrying` };
  }
  try {
    return { snapshot: await response.json() };
  } catch (error) {
    return { why: "The answer is not the dashboard's data (a proxy's page?); retrying" };
  }
}

let started = 0; // polls started
let newest = 0; // the latest poll whose outcome was shown: an older one answering late is dropped
let pending = null; // the next poll's timer
async function poll() {
  clearTimeout(pending);
  const mine = ++started;
  const outcome = await fetchSnapshot();
  if (mine < newest) return; // a later poll (the address changed) has spoken and set the timer
  newest = mine;
  if (outcome.snapshot) {
    latest = outcome.snapshot;
    try {
      render(latest);
      setConnection(true);
    } catch (error) { // the page's own fault: said as such, and polling goes on
      console.error(error);
      setConnection(false, `The page could not draw this data (${error.message})`);
    }
  } else {
    setConnection(false, outcome.why);
  }
  clearTimeout(pending); // a poll the address's change started meanwhile set one too: one chain
  pending = setTimeout(poll, Math.min(MAX_POLL_MS, POLL_MS * 2 ** Math.max(0, failures - 1)));
}

// Each chart is an image to a screen reader, named by its caption.
document.querySelectorAll("figure.chart").forEach((figure) => {
  const canvas = figure.querySelector("canvas");
  canvas.setAttribute("role", "img");
  canvas.setAttribute("aria-label", figure.querySelector("figcaption").textContent.replace(/\s+/g, " ").trim());
});
buildLegends();
readKey();
window.addEventListener("resize", () => latest && render(latest));
window.addEventListener("hashchange", () => { readKey(); poll(); });
poll();
