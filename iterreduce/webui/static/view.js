// The live page: polls api/state (built by iterreduce/webui/snapshot.py) and renders it.
// Every address is relative, so the page works behind YARN's and skein's proxies.
"use strict";

const POLL_MS = 2000;
const IMAGE_MS = 10000;     // images change slowly: fetched again at most this often
const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4b5563", "#ca8a04"];
const charts = [];          // {signature, plot, element}
let lastImageStep = -1, lastImageTime = 0;
let failures = 0;
const drawn = {};           // section -> what it last drew (JSON): unchanged sections are not redrawn

// Calls draw(state) only when key(state) differs from what the section last drew.
function once(section, value, draw) {
  const key = JSON.stringify(value);
  if (drawn[section] === key) return;
  drawn[section] = key;
  draw();
}

window.liveView = { state: null, updates: 0, charts };  // read by the browser test

function $(id) { return document.getElementById(id); }

function duration(seconds) {
  if (seconds === null || seconds === undefined) return "?";
  seconds = Math.round(seconds);
  const h = Math.floor(seconds / 3600), m = Math.floor((seconds % 3600) / 60), s = seconds % 60;
  return (h ? h + " h " : "") + (h || m ? m + " min " : "") + s + " s";
}

function clock(unix) {
  return unix ? new Date(unix * 1000).toLocaleTimeString() : "";
}

function cells(row, values) {
  row.replaceChildren(...values.map(v => {
    const td = document.createElement("td");
    td.textContent = v === null || v === undefined ? "" : String(v);
    return td;
  }));
}

function renderHeader(state) {
  const p = state.progress, job = state.job;
  document.title = (state.title || "Training job") + " - " + p.state;
  $("title").textContent = state.title || "Training job";
  $("state").textContent = p.state;
  $("state").className = "badge " + p.state;
  const parts = [];
  if (job.name) parts.push(job.name);
  if (job.workers) parts.push(job.workers + " workers");
  if (job.program) parts.push(job.program);
  $("job-line").textContent = parts.join(" · ");
  const links = $("links");  // where the job is shown beyond this page (a tracking server's run)
  links.replaceChildren(...Object.entries(state.links || {}).map(([name, url]) => {
    const a = document.createElement("a");
    a.href = url;
    a.textContent = name.replace(/_/g, " ");
    a.target = "_blank";
    a.rel = "noopener";
    return a;
  }));
  $("job-config").textContent = JSON.stringify(job.config || {}, null, 2);
}

function renderProgress(state) {
  const p = state.progress;
  $("bar-fill").style.width = (p.fraction === null ? 0 : 100 * p.fraction).toFixed(1) + "%";
  let line = p.of ? `step ${p.steps_done} of ${p.of}` : `${p.steps_done} records`;
  if (p.fraction !== null) line += ` (${(100 * p.fraction).toFixed(1)} %)`;
  if (p.where) line += ` · ${p.where}`;
  line += ` · ${duration(p.elapsed_s)} elapsed`;
  if (p.state === "running" && p.remaining_s !== null) line += ` · about ${duration(p.remaining_s)} left`;
  $("progress-line").textContent = line;
  const s = state.sync;
  $("sync-line").textContent = s.share === null ? "" :
    `synchronising: ${duration(s.seconds)} of ${duration(s.step_seconds)} of steps (${(100 * s.share).toFixed(1)} %)`;
  document.body.dataset.steps = String(p.steps_done);
}

// One uPlot per chart; series differ in their x values, so align them on the union of xs.
function chartData(chart) {
  const xs = [...new Set(chart.series.flatMap(s => s.x))].sort((a, b) => a - b);
  const data = [xs], labels = [];
  for (const s of chart.series) {
    const at = new Map(s.x.map((x, i) => [x, i]));
    for (const metric of chart.y) {
      data.push(xs.map(x => (at.has(x) ? s.y[metric][at.get(x)] : null)));
      const name = chart.y.length > 1 ? metric.replace(/_/g, " ") : "";
      labels.push([s.label, name].filter(Boolean).join(" ") || chart.title);
    }
  }
  return { data, labels };
}

function renderCharts(state) {
  const box = $("charts");
  state.charts.forEach((chart, i) => {
    const { data, labels } = chartData(chart);
    const signature = chart.title + "|" + labels.join("|");
    let entry = charts[i];
    if (entry && entry.signature !== signature) {
      entry.plot.destroy();
      entry.element.remove();
      entry = charts[i] = undefined;
    }
    if (!entry) {
      const element = document.createElement("div");
      element.className = "chart";
      const title = document.createElement("h3");
      title.textContent = chart.title;
      element.append(title);
      const next = charts[i + 1];
      box.insertBefore(element, next ? next.element : null);
      const opts = {
        width: Math.max(400, Math.min(640, box.parentElement.clientWidth / 2 - 20)), height: 240,
        scales: { x: { time: false } },
        axes: [{ label: chart.x, incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000] }, {}],  // whole epochs
        series: [{ label: chart.x }, ...labels.map((label, k) => ({
          label, stroke: COLORS[k % COLORS.length], width: 1.5, spanGaps: true, points: { show: false },
        }))],
      };
      entry = charts[i] = { signature, element, plot: new uPlot(opts, data, element) };
    } else {
      entry.plot.setData(data);
    }
    entry.points = data.slice(1).reduce((n, ys) => n + ys.filter(y => y !== null).length, 0);
  });
}

function renderImages(state) {
  const box = $("images");
  const step = state.progress.steps_done, now = Date.now();
  const due = step !== lastImageStep && (now - lastImageTime > IMAGE_MS || state.progress.state !== "running");
  if (!due && box.childElementCount === state.images.length) return;
  lastImageStep = step;
  lastImageTime = now;
  box.replaceChildren(...state.images.map(image => {
    const figure = document.createElement("div");
    figure.className = "image";
    const title = document.createElement("h3");
    title.textContent = image.title;
    const img = document.createElement("img");
    img.alt = image.title;
    img.src = `images/${encodeURIComponent(image.name)}.png?step=${step}`;
    img.onerror = () => figure.remove();  // not drawn yet (e.g. before the first layer exists)
    figure.append(title, img);
    return figure;
  }));
}

function renderWorkers(state) {
  const body = $("workers").tBodies[0];
  body.replaceChildren(...state.workers.map(w => {
    const row = document.createElement("tr");
    cells(row, [w.name, w.state, w.host, w.local == null ? "" : Math.round(100 * w.local) + " %",
      (w.shards || []).join(" "), w.restarts,
      w.samples_per_s === null ? "" : Math.round(w.samples_per_s),
      w.heartbeat_age_s === null ? "" : w.heartbeat_age_s.toFixed(1) + " s ago"]);
    return row;
  }));
  $("workers").hidden = state.workers.length === 0;
}

function renderEvents(state) {
  const body = $("events").tBodies[0];
  body.replaceChildren(...state.events.slice().reverse().map(e => {
    const row = document.createElement("tr");
    cells(row, [clock(e.time), e.text]);
    return row;
  }));
}

function render(state) {
  once("header", [state.title, state.job, state.progress.state], () => renderHeader(state));
  renderProgress(state);
  once("charts", state.charts, () => renderCharts(state));
  renderImages(state);
  once("workers", state.workers.map(w => [w.name, w.state, w.host, w.local, w.shards, w.restarts,
    Math.round(w.samples_per_s || 0), Math.round(w.heartbeat_age_s || 0)]), () => renderWorkers(state));
  once("events", state.events, () => renderEvents(state));
  window.liveView.state = state;
  window.liveView.updates += 1;
}

async function poll() {
  let state = null;
  try {
    const response = await fetch("api/state", { cache: "no-store" });
    if (!response.ok) throw new Error(`the server answered ${response.status}`);
    state = await response.json();
    failures = 0;
    $("banner").hidden = true;
    render(state);
  } catch (error) {
    failures += 1;
    const last = window.liveView.state;
    $("banner").hidden = false;
    $("banner").textContent = last && last.live
      ? "The job no longer answers: it has ended or its master was lost. Showing its last state."
      : `Cannot read the job's state: ${error.message}`;
    $("state").textContent = "unreachable";
    $("state").className = "badge unreachable";
  }
  const finished = state && ["done", "failed"].includes(state.progress.state);
  if (!finished && failures < 30) setTimeout(poll, POLL_MS * Math.min(1 + failures, 5));
}

poll();
