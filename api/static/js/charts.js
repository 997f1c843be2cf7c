// The fleet over the last 15 minutes (polls /v1/fleet/history), drawn with uPlot
// (api/static/vendor/uplot, loaded before this module as the global `uPlot`).
// Each chart element carries `data-points` and `data-max`: how many values it has drawn, and the
// largest.
import { call } from "./http.js";
import { $, clock } from "./dom.js";

const COLORS = ["#2563eb", "#d97706", "#059669", "#9333ea", "#dc2626", "#0891b2", "#65a30d"];
const LANES = ["interactive", "background", "batch"];
const HEIGHT = 170;

let samples = []; // oldest first
let windowS = 900;
let sampleS = 6;
const charts = new Map(); // element id -> { plot, signature }

// A chart's series: [label, value of a sample, dashed] for each line.
const CHARTS = {
  "chart-tokens": (models) => models.map((m) => [m, (s) => modelOf(s, m)?.tokens_per_s]),
  "chart-ttft": (models) => percentiles(models, "ttft"),
  "chart-queue-time": (models) => percentiles(models, "queue"),
  "chart-depth": () => LANES.map((lane) => [lane, (s) => s.models.reduce((n, m) => n + m.waiting[lane], 0)]),
  "chart-workers": (models) => models.map((m) => [m, (s) => modelOf(s, m)?.workers ?? 0]),
};

function modelOf(sample, model) {
  return sample.models.find((m) => m.model === model);
}

function percentiles(models, what) {
  return models.flatMap((m) => [
    [`${m} p50`, (s) => modelOf(s, m)?.[`${what}_p50_s`]],
    [`${m} p95`, (s) => modelOf(s, m)?.[`${what}_p95_s`], true],
  ]);
}

// Sample times, with a break (null values) where no sample was taken for a while (no worker).
function timeline() {
  const rows = [];
  for (const s of samples) {
    const last = rows.at(-1);
    if (last && s.at - last.at > 3 * sampleS) rows.push({ at: last.at + sampleS, gap: true });
    rows.push({ at: s.at, sample: s });
  }
  return rows;
}

function build(id, series) {
  const el = $(id).querySelector(".plot");
  const sparse = id === "chart-ttft" || id === "chart-queue-time";
  const colorOf = (i) => COLORS[(sparse ? i >> 1 : i) % COLORS.length];
  const opts = {
    width: Math.max(200, el.clientWidth),
    height: HEIGHT,
    scales: { x: { time: true, range: () => [lastAt() - windowS, lastAt()] }, y: { range: (u, lo, hi) => [0, Math.max(hi || 0, 1) * 1.1] } },
    axes: [{ size: 30 }, { size: 48 }],
    series: [
      {},
      ...series.map(([label, , dashed], i) => ({
        label,
        stroke: colorOf(i),
        width: 2,
        dash: dashed ? [6, 4] : undefined,
        // Percentiles exist only where jobs ended: joined across the periods without any.
        spanGaps: sparse,
        points: sparse ? { show: true, size: 5 } : { size: 5 },
      })),
    ],
    legend: { live: false },
  };
  return new uPlot(opts, [[], ...series.map(() => [])], el);
}

function lastAt() {
  return samples.length ? Math.max(samples.at(-1).at, Date.now() / 1000) : Date.now() / 1000;
}

function draw(id) {
  const models = [...new Set(samples.flatMap((s) => s.models.map((m) => m.model)))].sort();
  const series = CHARTS[id](models);
  const signature = series.map(([label]) => label).join("\n");
  let chart = charts.get(id);
  if (!chart || chart.signature !== signature) {
    if (chart) chart.plot.destroy();
    chart = { plot: build(id, series), signature };
    charts.set(id, chart);
  }
  const rows = timeline();
  const columns = series.map(([, value]) => rows.map((r) => (r.gap ? null : value(r.sample) ?? null)));
  chart.plot.setData([rows.map((r) => r.at), ...columns]);
  const values = columns.flat().filter((v) => v !== null);
  $(id).dataset.points = String(values.length);
  $(id).dataset.max = String(Math.max(0, ...values));
}

function drawAll() {
  for (const id of Object.keys(CHARTS)) draw(id);
}

export async function pollHistory() {
  try {
    const since = samples.length ? `?since=${samples.at(-1).at}` : "";
    const history = await call(`/v1/fleet/history${since}`);
    windowS = history.window_s;
    sampleS = history.sample_s;
    const floor = Date.now() / 1000 - windowS;
    samples = samples.concat(history.samples).filter((s) => s.at > floor);
    drawAll();
    $("charts-status").textContent = samples.length
      ? `a sample every ${sampleS}s, last at ${clock(samples.at(-1).at)}`
      : "no samples yet: they are taken while a worker is live";
  } catch (err) {
    $("charts-status").textContent = err.message;
  }
  setTimeout(pollHistory, Math.max(1000, sampleS * 1000));
}

// The key changed: what was drawn may belong to another fleet view.
export function resetHistory() {
  samples = [];
}

export function initCharts() {
  const resize = new ResizeObserver(() => {
    for (const [id, chart] of charts) {
      const width = Math.max(200, $(id).querySelector(".plot").clientWidth);
      if (width !== chart.plot.width) chart.plot.setSize({ width, height: HEIGHT });
    }
  });
  for (const id of Object.keys(CHARTS)) resize.observe($(id));
}
