// The chat playground: streams /v1/chat/completions; Stop aborts the fetch, which cancels the job
// (the API cancels a job whose client went away). Model output is set as text, never HTML.
import { call, errorMessage, headers } from "./http.js";
import { $ } from "./dom.js";

const turns = []; // the conversation so far (user and assistant messages)
let running = null; // the AbortController of the request streaming now

export async function loadModels() {
  const select = $("model");
  try {
    const models = await call("/v1/models");
    const chosen = select.value;
    select.replaceChildren();
    // Chat models only: an embedding model cannot answer a chat (its workers say which it is).
    for (const model of models.data.filter((m) => m.kind !== "embedding")) {
      const option = document.createElement("option");
      option.value = model.id;
      option.textContent = model.id;
      select.append(option);
    }
    if (chosen) select.value = chosen;
  } catch (err) {
    $("chat-status").textContent = err.message;
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

async function stream(answer, controller) {
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
  return finish;
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
    const finish = await stream(answer, controller);
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

export function initPlayground() {
  $("chat-form").addEventListener("submit", send);
  $("stop-button").addEventListener("click", () => running && running.abort());
  $("clear").addEventListener("click", () => {
    turns.length = 0;
    $("transcript").replaceChildren();
  });
}
