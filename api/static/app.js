// mlxq's page: a live fleet view (polls /v1/fleet) and a chat playground (streams
// /v1/chat/completions). The API key stays in this browser (localStorage) and goes out only as
// an Authorization header to this origin. Everything from the server is set as text, never HTML.
"use strict";

const KEY_STORE = "mlxq.apiKey";
const POLL_MS = 1000;
const $ = (id) => document.getElementById(id);
const turns = []; // the conversation so far (user and assistant messages)
let running = null; // the AbortController of the request streaming now

function headers(json) {
  const h = {};
  const key = localStorage.getItem(KEY_STORE);
  if (key) h.Authorization = `Bearer ${key}`;
  if (json) h["Content-Type"] = "application/json";
  return h;
}

async function errorMessage(response) {
  try {
    const body = await response.json();
    return body.error && body.error.message ? body.error.message : `HTTP ${response.status}`;
  } catch (err) {
    return `HTTP ${response.status}`;
  }
}

function cell(row, text, className) {
  const td = row.insertCell();
  td.textContent = text;
  if (className) td.className = className;
  return td;
}

function seconds(value) {
  return value === null || value === undefined ? "-" : `${value.toFixed(2)}s`;
}

function lane(view) {
  const oldest = view.oldest_waiting_s === null ? "" : ` (oldest ${view.oldest_waiting_s.toFixed(1)}s)`;
  return `${view.waiting} waiting, ${view.running} running${oldest}`;
}

function fill(tableId, rows, addRow) {
  const body = $(tableId).tBodies[0];
  body.replaceChildren();
  for (const item of rows) addRow(body.insertRow(), item);
}

function showFleet(fleet) {
  fill("workers", fleet.workers, (row, w) => {
    const used = Object.values(w.running).reduce((a, b) => a + b, 0);
    row.dataset.worker = w.worker_id;
    cell(row, w.worker_id);
    cell(row, w.host);
    cell(row, w.model);
    cell(row, `${used}/${w.batch_size}`, used > 0 ? "slots busy" : "slots");
    cell(row, w.tokens_per_s.toFixed(1));
    cell(row, `${(fleet.taken_at - w.last_heartbeat).toFixed(1)}s ago`);
  });
  fill("models", fleet.models, (row, m) => {
    const lanes = Object.fromEntries(m.lanes.map((l) => [l.lane, lane(l)]));
    cell(row, m.model);
    cell(row, String(m.live_workers));
    cell(row, `${m.slots_used}/${m.slots_total}`);
    cell(row, m.tokens_per_s.toFixed(1));
    cell(row, lanes.interactive);
    cell(row, lanes.background);
    cell(row, lanes.batch);
  });
  fill("jobs", fleet.recent_jobs, (row, j) => {
    const first = j.first_token_at === null ? null : j.first_token_at - j.enqueued_at;
    cell(row, j.job_id, "job").title = j.job_id;
    cell(row, j.lane);
    const status = j.finish_reason === "cancelled" ? "cancelled" : j.finish_reason === "error" ? "failed" : "completed";
    cell(row, status, status);
    cell(row, j.finish_reason);
    cell(row, `${j.prompt_tokens}+${j.completion_tokens}`);
    cell(row, seconds(first));
    cell(row, seconds(j.ended_at - j.enqueued_at));
    cell(row, j.worker);
  });
}

async function pollFleet() {
  try {
    const response = await fetch("/v1/fleet", { headers: headers(false) });
    if (!response.ok) {
      $("fleet-status").textContent = await errorMessage(response);
    } else {
      showFleet(await response.json());
      $("fleet-status").textContent = `updated ${new Date().toLocaleTimeString()}`;
    }
  } catch (err) {
    $("fleet-status").textContent = `cannot reach the API: ${err.message}`;
  }
  setTimeout(pollFleet, POLL_MS);
}

async function loadModels() {
  const select = $("model");
  try {
    const response = await fetch("/v1/models", { headers: headers(false) });
    if (!response.ok) {
      $("chat-status").textContent = await errorMessage(response);
      return;
    }
    const chosen = select.value;
    select.replaceChildren();
    for (const model of (await response.json()).data) {
      const option = document.createElement("option");
      option.value = model.id;
      option.textContent = model.id;
      select.append(option);
    }
    if (chosen) select.value = chosen;
  } catch (err) {
    $("chat-status").textContent = `cannot reach the API: ${err.message}`;
  }
}

function addMessage(role, text) {
  const div = document.createElement("div");
  div.className = `message ${role}`;
  div.textContent = text;
  $("transcript").append(div);
  $("transcript").scrollTop = $("transcript").scrollHeight;
  return div;
}

function requestBody() {
  const messages = [];
  const system = $("system").value.trim();
  if (system) messages.push({ role: "system", content: system });
  messages.push(...turns);
  const body = {
    model: $("model").value,
    messages,
    stream: true,
    temperature: Number($("temperature").value),
    max_tokens: Number.parseInt($("max-tokens").value, 10),
  };
  const stop = $("stop").value.split("\n").filter((s) => s.length > 0);
  if (stop.length) body.stop = stop;
  return body;
}

// Reads an SSE body: calls onData with each `data:` payload, in order.
async function readEvents(response, onData) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = event.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart());
      if (data.length && onData(data.join("\n")) === false) return;
    }
  }
}

function setRunning(controller) {
  running = controller;
  $("send").disabled = controller !== null;
  $("stop-button").disabled = controller === null;
}

async function send(event) {
  event.preventDefault();
  const text = $("message").value;
  if (!text.trim() || running) return;
  turns.push({ role: "user", content: text });
  addMessage("user", text);
  $("message").value = "";
  const answer = addMessage("assistant", "");
  answer.dataset.state = "waiting";
  const controller = new AbortController();
  setRunning(controller);
  $("chat-status").textContent = "waiting for the first token";
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: headers(true),
      body: JSON.stringify(requestBody()),
      signal: controller.signal,
    });
    if (!response.ok) throw new Error(await errorMessage(response));
    answer.dataset.state = "streaming";
    $("chat-status").textContent = "streaming";
    let finish = null;
    await readEvents(response, (data) => {
      if (data === "[DONE]") return false;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message);
      for (const choice of chunk.choices) {
        if (choice.delta && choice.delta.content) answer.textContent += choice.delta.content;
        if (choice.finish_reason) finish = choice.finish_reason;
      }
      $("transcript").scrollTop = $("transcript").scrollHeight;
      return true;
    });
    turns.push({ role: "assistant", content: answer.textContent });
    answer.dataset.state = "done";
    $("chat-status").textContent = `done (${finish})`;
  } catch (err) {
    turns.pop(); // the turn is not kept: the user may edit and resend
    if (controller.signal.aborted) {
      answer.dataset.state = "stopped";
      $("chat-status").textContent = "stopped";
    } else {
      answer.dataset.state = "error";
      answer.textContent += `\n[${err.message}]`;
      $("chat-status").textContent = "error";
    }
  } finally {
    setRunning(null);
  }
}

function init() {
  $("api-key").value = localStorage.getItem(KEY_STORE) || "";
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    localStorage.setItem(KEY_STORE, $("api-key").value.trim());
    loadModels();
  });
  $("forget-key").addEventListener("click", () => {
    localStorage.removeItem(KEY_STORE);
    $("api-key").value = "";
  });
  $("chat-form").addEventListener("submit", send);
  $("stop-button").addEventListener("click", () => running && running.abort());
  $("clear").addEventListener("click", () => {
    turns.length = 0;
    $("transcript").replaceChildren();
  });
  loadModels();
  pollFleet();
}

init();
