"use strict";
// The chat page: streams /v1/chat/completions from this shim, as any OpenAI client does. The conversation lives in
// the page; Stop aborts the request, and the shim, seeing the connection close, ends the generation and frees its
// KV blocks.

const $ = (id) => document.getElementById(id);
const KEY_STORE = "tritonllm.api_key";
const state = { history: [], controller: null, cards: [], images: [] };

function setStatus(text) {
  $("status").textContent = text;
}

function requestHeaders() {
  const headers = { "Content-Type": "application/json" };
  const key = $("api_key").value.trim();
  if (key) headers.Authorization = `Bearer ${key}`;
  return headers;
}

async function loadModels() {
  const response = await fetch("/v1/models", { headers: requestHeaders() });
  if (response.status === 401) {
    setStatus("This server asks for an API key: enter it under API key.");
    return;
  }
  const cards = (await response.json()).data;
  // Chat models: the LLMs (their cards say what their prompts take) and their LoRA adapters.
  const llms = new Set(cards.filter((card) => card.input_modalities).map((card) => card.id));
  state.cards = cards.filter((card) => llms.has(card.id) || llms.has(card.parent));
  const picker = $("model");
  const chosen = picker.value;
  picker.replaceChildren(...state.cards.map((card) => new Option(card.id, card.id)));
  if (state.cards.some((card) => card.id === chosen)) picker.value = chosen;
  picker.closest("label").hidden = state.cards.length < 2;
  setStatus(state.cards.length ? "" : "This server serves no chat model.");
  showAttach();
}

function showAttach() {
  const card = state.cards.find((c) => c.id === $("model").value);
  const takes = (card && (card.input_modalities || llmCard(card.parent)?.input_modalities)) || [];
  $("attach").hidden = !takes.includes("image");
}

function llmCard(id) {
  return state.cards.find((card) => card.id === id);
}

function sampling() {
  const body = {};
  const number = (id) => ($(id).value.trim() === "" ? undefined : Number($(id).value));
  for (const field of ["temperature", "top_p", "max_tokens", "seed"]) {
    const value = number(field);
    if (value !== undefined) body[field] = value;
  }
  const extra = $("extra").value.trim();
  return extra ? { ...body, ...JSON.parse(extra) } : body;
}

function addMessage(role) {
  const box = document.createElement("div");
  box.className = `message ${role}`;
  box.innerHTML = `<div class="role">${role}</div><div class="body"></div>`;
  $("messages").append(box);
  box.scrollIntoView({ block: "end" });
  return box;
}

function userContent(text) {
  if (!state.images.length) return text;
  return [{ type: "text", text }, ...state.images.map((url) => ({ type: "image_url", image_url: { url } }))];
}

async function send(text) {
  let fields;
  try {
    fields = sampling();
  } catch (error) {
    setStatus(`More fields: ${error.message}`);
    return;
  }
  const user = addMessage("user");
  user.querySelector(".body").textContent = text;
  for (const url of state.images) user.append(Object.assign(document.createElement("img"), { src: url }));
  state.history.push({ role: "user", content: userContent(text) });
  state.images = [];
  $("attachments").replaceChildren();

  const system = $("system").value.trim();
  const messages = system ? [{ role: "system", content: system }, ...state.history] : [...state.history];
  const body = { ...fields, model: $("model").value, messages, stream: true, stream_options: { include_usage: true } };
  const answer = addMessage("assistant");
  const view = { answer: "", reasoning: "", box: answer };
  state.controller = new AbortController();
  setBusy(true);
  const started = performance.now();
  let first = null;
  let usage = null;
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: requestHeaders(),
      body: JSON.stringify(body),
      signal: state.controller.signal,
    });
    if (!response.ok) {
      const error = await response.json().catch(() => ({}));
      throw new Error(error.error?.message || `HTTP ${response.status}`);
    }
    for await (const chunk of events(response)) {
      if (chunk.error) throw new Error(chunk.error.message);
      if (chunk.usage) usage = chunk.usage;
      const delta = chunk.choices?.[0]?.delta;
      if (!delta) continue;
      if ((delta.content || delta.reasoning_content) && first === null) first = performance.now();
      view.answer += delta.content || "";
      view.reasoning += delta.reasoning_content || "";
      draw(view);
    }
    state.history.push({ role: "assistant", content: view.answer });
    finish(view, started, first, usage, "");
  } catch (error) {
    if (error.name === "AbortError") {
      if (view.answer) state.history.push({ role: "assistant", content: view.answer });
      finish(view, started, first, usage, "stopped");
    } else {
      answer.querySelector(".body").insertAdjacentHTML("beforeend", `<p class="error"></p>`);
      answer.querySelector(".error").textContent = error.message;
      state.history.pop();
    }
  } finally {
    state.controller = null;
    setBusy(false);
  }
}

// The stream's server-sent events, each `data:` line's JSON, until `[DONE]`.
async function* events(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let pending = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    pending += value;
    const lines = pending.split("\n");
    pending = lines.pop();
    for (const line of lines) {
      if (!line.startsWith("data:")) continue;
      const data = line.slice(5).trim();
      if (data === "[DONE]") return;
      yield JSON.parse(data);
    }
  }
}

function draw(view) {
  const body = view.box.querySelector(".body");
  const thinking = view.reasoning
    ? `<details class="reasoning" open><summary>Reasoning</summary>${escapeHtml(view.reasoning)}</details>`
    : "";
  body.innerHTML = thinking + renderMarkdown(view.answer);
  view.box.scrollIntoView({ block: "end" });
}

function finish(view, started, first, usage, note) {
  const meta = document.createElement("div");
  meta.className = "meta";
  const parts = [];
  if (note) parts.push(note);
  if (usage && first !== null) {
    const seconds = (performance.now() - first) / 1000;
    const rate = usage.completion_tokens > 1 && seconds > 0 ? (usage.completion_tokens - 1) / seconds : null;
    parts.push(`${usage.completion_tokens} tokens`);
    if (rate !== null) parts.push(`${rate.toFixed(1)} tokens/s`);
    parts.push(`first token after ${((first - started) / 1000).toFixed(2)} s`);
  }
  meta.textContent = parts.join(" · ");
  view.box.append(meta);
}

function setBusy(busy) {
  $("send").hidden = busy;
  $("stop").hidden = !busy;
  $("prompt").disabled = busy;
}

$("composer").addEventListener("submit", (event) => {
  event.preventDefault();
  const text = $("prompt").value.trim();
  if (!text || state.controller) return;
  $("prompt").value = "";
  send(text);
});
$("prompt").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey) {
    event.preventDefault();
    $("composer").requestSubmit();
  }
});
$("stop").addEventListener("click", () => state.controller?.abort());
$("clear").addEventListener("click", () => {
  state.history = [];
  $("messages").replaceChildren();
});
$("model").addEventListener("change", showAttach);
$("api_key").value = localStorage.getItem(KEY_STORE) || "";
$("api_key").addEventListener("change", () => {
  localStorage.setItem(KEY_STORE, $("api_key").value.trim());
  loadModels();
});
$("image").addEventListener("change", async (event) => {
  for (const file of event.target.files) {
    const url = await new Promise((resolve) => {
      const reader = new FileReader();
      reader.onload = () => resolve(reader.result);
      reader.readAsDataURL(file);
    });
    state.images.push(url);
    $("attachments").append(Object.assign(document.createElement("img"), { src: url }));
  }
  event.target.value = "";
});
loadModels();
