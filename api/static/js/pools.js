// Each machine's model pool, from the /v1/fleet snapshot that fleet.js polls (its `pools`: one
// PoolReport of shared/wire/fleet/pool.py per machine): the memory its models are counted at
// against its budget and what its workers measure, the models it holds and on which worker, and its
// last loads, unloads, evictions and failed loads. A fleet of fixed workers has no pool.
import { $, ago, cell, clock, fill, seconds } from "./dom.js";

const MIB = 2 ** 20;
const GIB = 2 ** 30;

const gib = (bytes) => (bytes / GIB).toFixed(2);
const mib = (bytes) => `${Math.round(bytes / MIB).toLocaleString("en")} MiB`;

// A failed load reads as a failed job does (style.css).
const EVENT_CLASS = { load_failed: "failed" };

function showHeld(table, pool, now) {
  fill(table, pool.held, (row, h) => {
    row.dataset.model = h.model;
    row.dataset.state = h.state;
    cell(row, h.model, "id").title = h.model;
    cell(row, h.state, `state ${h.state}`);
    cell(row, h.worker_id, "id").title = h.worker_id;
    cell(row, mib(h.rss_bytes));
    cell(row, h.pinned ? "pinned" : "-");
    cell(row, clock(h.loaded_at));
    cell(row, ago(now, h.last_used));
  });
}

function showEvents(table, pool) {
  fill(table, pool.events, (row, e) => {
    row.dataset.what = e.what;
    row.dataset.model = e.model;
    cell(row, clock(e.at));
    cell(row, e.what, EVENT_CLASS[e.what]);
    cell(row, e.model, "id").title = e.model;
    cell(row, seconds(e.seconds));
    cell(row, e.why || "-");
  });
}

function showMemory(view, pool) {
  const meter = view.querySelector(".memory meter");
  meter.max = pool.budget_bytes;
  meter.high = 0.9 * pool.budget_bytes;
  meter.value = pool.used_bytes;
  meter.title = `${pool.used_bytes.toLocaleString("en")} of ${pool.budget_bytes.toLocaleString("en")} bytes`;
  view.querySelector(".used").textContent = `${gib(pool.used_bytes)} / ${gib(pool.budget_bytes)} GiB`;
  view.querySelector(".resident").textContent = `${gib(pool.rss_bytes)} GiB`;
  view.querySelector(".counts").textContent =
    `loads ${pool.loads} · evictions ${pool.evictions} · unloads ${pool.unloads} · failed loads ${pool.failed_loads}`;
}

// One machine's view, cloned from the page's template.
function poolView(pool, now) {
  const view = $("pool-view").content.firstElementChild.cloneNode(true);
  view.dataset.machine = pool.machine;
  view.querySelector(".machine").textContent = pool.machine;
  view.querySelector(".spare").textContent = pool.spare_id ? `spare worker ${pool.spare_id}` : "no spare worker";
  showMemory(view, pool);
  showHeld(view.querySelector("table.held"), pool, now);
  showEvents(view.querySelector("table.events"), pool);
  return view;
}

export function showPools(fleet) {
  const own = fleet.scope === "owner";
  $("pools").hidden = own;
  $("pools-empty").hidden = own || fleet.pools.length > 0;
  // By name: the snapshot lists machines by their last beat, which changes every beat.
  const pools = [...fleet.pools].sort((a, b) => a.machine.localeCompare(b.machine));
  $("pool-list").replaceChildren(...pools.map((p) => poolView(p, fleet.taken_at)));
}
