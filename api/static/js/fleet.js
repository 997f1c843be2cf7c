// The fleet now (polls /v1/fleet): live workers, queues per model and lane, the last jobs; a job
// of the list opens in a dialog with its model, lane, worker, timings, tokens and how it ended.
// The same snapshot feeds the model pools (pools.js). A key that is not an operator's sees its
// own jobs and no workers nor pools (scope "owner").
import { call } from "./http.js";
import { $, ago, button, cell, clock, fill, seconds } from "./dom.js";
import { showPools } from "./pools.js";

const POLL_MS = 1000;

// As shared/observe/metrics.py JobRecord.status, and "skipped": a batch line its stopped batch
// never ran.
function jobStatus(job) {
  if (job.finish_reason === "cancelled" || job.finish_reason === "skipped") return job.finish_reason;
  return job.finish_reason === "error" ? "failed" : "completed";
}

// A long id keeps its start and its end: batch lines share their batch's prefix.
function shortId(id) {
  return id.length > 20 ? `${id.slice(0, 11)}…${id.slice(-7)}` : id;
}

// Timings of a finished job (unix s): the same rules as shared/observe/metrics.py JobRecord.
function timings(job) {
  const ttft = job.first_token_at === null ? null : job.first_token_at - job.enqueued_at;
  const decoding = job.first_token_at === null ? null : job.ended_at - job.first_token_at;
  return {
    queue: Math.max(0, job.started_at - job.enqueued_at),
    ttft,
    total: job.ended_at - job.enqueued_at,
    speed: decoding && job.completion_tokens > 1 ? (job.completion_tokens - 1) / decoding : null,
  };
}

function lane(view) {
  const oldest = view.oldest_waiting_s === null ? "" : ` · ${view.oldest_waiting_s.toFixed(1)}s`;
  return `${view.waiting} / ${view.running}${oldest}`;
}

function showJob(job) {
  const t = timings(job);
  const status = jobStatus(job);
  const fields = [
    ["job", job.job_id],
    ["model", job.model],
    ["lane", job.lane],
    ["worker", job.worker || "-"],
    ["status", status === job.finish_reason ? status : `${status} (${job.finish_reason})`],
    ["queued at", clock(job.enqueued_at)],
    ["queue time", seconds(t.queue)],
    ["time to first token", seconds(t.ttft)],
    ["duration", seconds(t.total)],
    ["decoding speed", t.speed === null ? "-" : `${t.speed.toFixed(1)} tok/s`],
    ["prompt tokens", `${job.prompt_tokens} (${job.cached_tokens} from the prefix cache)`],
    ["completion tokens", String(job.completion_tokens)],
  ];
  if (job.error) fields.push(["error", job.error]);
  const list = $("job-fields");
  list.replaceChildren();
  for (const [name, value] of fields) {
    const dt = document.createElement("dt");
    const dd = document.createElement("dd");
    dt.textContent = name;
    dd.textContent = value;
    dd.dataset.field = name;
    if (name === "status" || name === "error") dd.className = status;
    list.append(dt, dd);
  }
  $("job-view").showModal();
}

function showFleet(fleet) {
  const own = fleet.scope === "owner";
  $("workers-wrap").hidden = own;
  $("jobs-title").textContent = own ? "Your last jobs" : "Last jobs";
  fill("workers", fleet.workers, (row, w) => {
    const used = Object.values(w.running).reduce((a, b) => a + b, 0);
    row.dataset.worker = w.worker_id;
    cell(row, w.worker_id, "id").title = w.worker_id;
    cell(row, w.host);
    cell(row, w.model, "id").title = w.model;
    cell(row, `${used}/${w.batch_size}`, used > 0 ? "slots busy" : "slots");
    cell(row, w.tokens_per_s.toFixed(1));
    cell(row, ago(fleet.taken_at, w.last_heartbeat));
  });
  fill("models", fleet.models, (row, m) => {
    const lanes = Object.fromEntries(m.lanes.map((l) => [l.lane, lane(l)]));
    cell(row, m.model, "id").title = m.model;
    cell(row, String(m.live_workers));
    cell(row, `${m.slots_used}/${m.slots_total}`);
    cell(row, m.tokens_per_s.toFixed(1));
    cell(row, lanes.interactive);
    cell(row, lanes.background);
    cell(row, lanes.batch);
  });
  fill("jobs", fleet.recent_jobs, (row, j) => {
    const t = timings(j);
    const status = jobStatus(j);
    row.dataset.job = j.job_id;
    row.addEventListener("click", () => showJob(j));
    const open = cell(row, "", "id");
    open.title = j.job_id;
    open.append(button(shortId(j.job_id), () => {}, "link"));
    cell(row, j.lane);
    cell(row, status === "completed" ? `${status} (${j.finish_reason})` : status, status);
    cell(row, `${j.prompt_tokens}+${j.completion_tokens}`);
    cell(row, seconds(t.queue));
    cell(row, seconds(t.ttft));
    cell(row, seconds(t.total));
    cell(row, j.worker, "id").title = j.worker;
  });
  showPools(fleet);
}

export async function pollFleet() {
  try {
    showFleet(await call("/v1/fleet"));
    $("fleet-status").textContent = `updated ${clock(Date.now() / 1000)}`;
  } catch (err) {
    $("fleet-status").textContent = err.message;
  }
  setTimeout(pollFleet, POLL_MS);
}

export function initJobView() {
  $("job-view-close").addEventListener("click", () => $("job-view").close());
}
