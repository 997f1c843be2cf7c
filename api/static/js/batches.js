// The caller's batches (polls GET /v1/batches with the page's key): status, progress, times,
// their files to download, and a cancel button.
import { call, headers, errorMessage } from "./http.js";
import { $, button, cell, clock, fill } from "./dom.js";

const POLL_MS = 2000;
const ENDED = new Set(["completed", "failed", "expired", "cancelled"]);

function finishedAt(b) {
  return b.completed_at ?? b.failed_at ?? b.cancelled_at ?? b.expired_at ?? null;
}

// The file's content is fetched with the key, then handed to the browser as a download.
async function download(fileId, name) {
  try {
    const response = await fetch(`/v1/files/${encodeURIComponent(fileId)}/content`, { headers: headers(false) });
    if (!response.ok) throw new Error(await errorMessage(response));
    const url = URL.createObjectURL(await response.blob());
    const link = document.createElement("a");
    link.href = url;
    link.download = `${name}.jsonl`;
    link.click();
    setTimeout(() => URL.revokeObjectURL(url), 10_000);
  } catch (err) {
    $("batches-status").textContent = `download failed: ${err.message}`;
  }
}

async function cancel(batchId) {
  try {
    await call(`/v1/batches/${encodeURIComponent(batchId)}/cancel`, "POST");
    await refresh();
  } catch (err) {
    $("batches-status").textContent = `cancel failed: ${err.message}`;
  }
}

function progress(td, counts) {
  const bar = document.createElement("progress");
  bar.max = Math.max(1, counts.total);
  bar.value = counts.completed + counts.failed;
  const text = document.createElement("span");
  text.className = "counts";
  text.textContent = `${counts.completed} done, ${counts.failed} failed of ${counts.total}`;
  td.append(bar, text);
}

function files(td, b) {
  for (const [label, id] of [["input", b.input_file_id], ["output", b.output_file_id], ["errors", b.error_file_id]]) {
    if (id) td.append(button(label, () => download(id, `${b.id}_${label}`), `download ${label}`));
  }
}

function showBatches(list) {
  fill("batch-list", list.data, (row, b) => {
    row.dataset.batch = b.id;
    cell(row, b.id, "id").title = b.id;
    cell(row, b.model ?? "-", "id");
    cell(row, b.status, `status ${b.status}`);
    progress(cell(row, ""), b.request_counts);
    cell(row, clock(b.created_at));
    cell(row, clock(finishedAt(b)));
    files(cell(row, "", "files"), b);
    const action = cell(row, "");
    if (!ENDED.has(b.status) && b.status !== "cancelling") {
      action.append(button("Cancel", () => cancel(b.id), "cancel"));
    }
  });
  $("batches-status").textContent = list.data.length ? "" : "none yet: submit one with POST /v1/batches or `mlxq batch`";
}

async function refresh() {
  showBatches(await call("/v1/batches?limit=20"));
}

export async function pollBatches() {
  try {
    await refresh();
  } catch (err) {
    $("batches-status").textContent = err.message;
  }
  setTimeout(pollBatches, POLL_MS);
}
