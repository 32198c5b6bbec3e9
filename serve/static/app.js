// The LongRAG playground: plain JavaScript over the app's own HTTP API (no build step).
// /v1/answer with "stream": true is a POST, so its server-sent events are read with fetch and a
// ReadableStream (EventSource can only GET).
"use strict";

const $ = (id) => document.getElementById(id);
const state = { apiKeys: false };

// ------------------------------------------------------------------ HTTP
function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api-key").value.trim();
  if (state.apiKeys && key) h["Authorization"] = "Bearer " + key;
  return h;
}

async function failure(response) {
  // Every error of the app is {"error": {"code", "message", "detail"}}; Serve's own are text.
  const text = await response.text();
  try {
    const body = JSON.parse(text);
    if (body.error && body.error.message) return `${response.status} ${body.error.code}: ${body.error.message}`;
  } catch (_) { /* not JSON */ }
  return `${response.status}: ${text.slice(0, 300)}`;
}

async function post(path, body) {
  const response = await fetch(path, { method: "POST", headers: headers(), body: JSON.stringify(body) });
  if (!response.ok) throw new Error(await failure(response));
  return response;
}

// Server-sent events of a fetch response: yields {event, data} with data parsed as JSON.
async function* events(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true }).replace(/\r\n/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let event = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) event = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).trimStart());
      }
      if (data.length) yield { event, data: JSON.parse(data.join("\n")) };
    }
  }
}

// ------------------------------------------------------------------ rendering
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k === "title") node.title = v;
    else node.setAttribute(k, v);
  }
  for (const c of children) if (c !== null && c !== undefined) node.append(c);
  return node;
}

const STOP = new Set("a an and are as at be by did do does for from has have how in is it its of on or that the this to was were what when where which who whom whose why with".split(" "));

// The text with the question's content words (whole words, any case) marked (<mark>), built as DOM nodes (no HTML injection).
function highlighted(text, question) {
  const words = [...new Set((question.toLowerCase().match(/[\p{L}\p{N}]+/gu) || []).filter((w) => w.length > 2 && !STOP.has(w)))];
  const out = el("span");
  if (!words.length) { out.textContent = text; return out; }
  const escaped = words.map((w) => w.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"));
  const re = new RegExp(`(?<![\\p{L}\\p{N}])(?:${escaped.join("|")})(?![\\p{L}\\p{N}])`, "giu");  // whole words
  let last = 0;
  for (const m of text.matchAll(re)) {
    out.append(text.slice(last, m.index), el("mark", {}, m[0]));
    last = m.index + m[0].length;
  }
  out.append(text.slice(last));
  return out;
}

// Evidence units: rank, titles, score, used, the best chunk (highlighted).
function renderUnits(list, units, question) {
  list.replaceChildren();
  units.forEach((u) => {
    const item = el("li", { class: "unit", "data-unit": u.unit_id },
      el("div", { class: "unit-head" },
        el("span", { class: "score", title: "MaxP score: the unit's best chunk" }, Number(u.score).toFixed(3)),
        el("span", { class: "titles" }, (u.titles || []).join(" · ") || u.unit_id),
        el("span", { class: "badge used", hidden: "" }, "used"),
        el("span", { class: "muted small" }, u.shard !== undefined ? `shard ${u.shard}` : ""),
        el("span", { class: "muted small found-by", title: "which search found it" }, u.found_by || "")));
    if (u.best_chunk) item.append(el("blockquote", { class: "best-chunk", title: "best chunk" }, highlighted(u.best_chunk, question)));
    list.append(item);
  });
}

function markUsed(list, evidence) {
  const used = new Set(evidence.filter((e) => e.used).map((e) => e.unit_id));
  for (const item of list.querySelectorAll("li.unit")) {
    const isUsed = used.has(item.dataset.unit);
    item.classList.toggle("is-used", isUsed);
    item.querySelector(".badge.used").hidden = !isUsed;
  }
}

const COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f"];

// The per-stage trace as one horizontal bar: the top-level *_ms stages (a dual run's or a
// long-document strategy's stages in their place), the rest of total_ms as "other".
function traceStages(trace) {
  const stages = [];
  const dualStages = (trace.dual && trace.dual.stages) || trace.stages;
  for (const [key, value] of Object.entries(trace)) {
    if (!key.endsWith("_ms") || key.includes(".") || key === "total_ms" || typeof value !== "number") continue;
    if (key === "dual_ms" && dualStages) continue;
    stages.push([key.slice(0, -3), value]);
  }
  if (Array.isArray(dualStages)) for (const s of dualStages) stages.push([s.stage, s.wall_ms]);
  return stages;
}

function renderTrace(box, trace) {
  box.replaceChildren();
  const stages = traceStages(trace).filter(([, ms]) => ms > 0);
  const sum = stages.reduce((a, [, ms]) => a + ms, 0);
  const total = Math.max(trace.total_ms || 0, sum);
  if (!total) return;
  if (total - sum > total * 0.01) stages.push(["other", total - sum]);
  const bar = el("div", { class: "bar" });
  const legend = el("div", { class: "legend" });
  stages.forEach(([name, ms], i) => {
    const color = COLORS[i % COLORS.length];
    const seg = el("div", { class: "seg", "data-stage": name, title: `${name}: ${ms.toFixed(1)} ms` });
    seg.style.width = `${(100 * ms) / total}%`;
    seg.style.background = color;
    bar.append(seg);
    const swatch = el("i");
    swatch.style.background = color;
    legend.append(el("span", {}, swatch, `${name} ${fmtMs(ms)}`));
  });
  box.append(bar, legend, el("div", { class: "muted small" }, `total ${fmtMs(total)}`));
}

function fmtMs(ms) {
  return ms >= 1000 ? `${(ms / 1000).toFixed(2)} s` : `${ms.toFixed(1)} ms`;
}

function busy(button, status, text) {
  button.disabled = !!text;
  status.classList.remove("error");
  status.textContent = text || "";
}

function fail(button, status, err) {
  button.disabled = false;
  status.classList.add("error");
  status.textContent = String(err.message || err);
}

// ------------------------------------------------------------------ ask the index
async function ask(event) {
  event.preventDefault();
  const question = $("question").value.trim();
  const k = parseInt($("k").value, 10);
  const strategy = $("strategy").value;
  const mode = $("mode").value || undefined;
  const button = $("ask"), status = $("status");
  if (!question) return;
  $("answer").textContent = "";
  $("long-answer").textContent = "";
  $("long-answer-box").hidden = !!strategy;
  $("evidence").replaceChildren();
  $("trace").replaceChildren();
  $("coverage").textContent = "";
  const t0 = performance.now();
  try {
    if (strategy) await askDual(question, k, strategy, mode, button, status);
    else await askStreamed(question, k, mode, button, status);
    busy(button, status, "");
    status.textContent = `done in ${fmtMs(performance.now() - t0)}`;
    document.body.dataset.answered = "yes";
  } catch (err) {
    fail(button, status, err);
  }
}

function showCoverage(coverage) {
  const c = coverage;
  $("coverage").textContent = `${c.answered} of ${c.shards} shards` + (c.degraded ? ` (degraded: shards ${c.failed_shards.join(", ")} did not answer)` : "");
}

async function askStreamed(question, k, mode, button, status) {
  busy(button, status, "retrieving…");
  const response = await post("/v1/answer", { question, k, mode, stream: true });
  for await (const { event, data } of events(response)) {
    if (event === "retrieval") {
      renderUnits($("evidence"), data.units, question);
      showCoverage(data.coverage);
      renderTrace($("trace"), data.trace);
      status.textContent = "reading…";
    } else if (event === "token") {
      $("long-answer").textContent += data.text;
    } else if (event === "trace") {
      $("answer").textContent = data.answer;
      $("long-answer").textContent = data.long_answer;
      markUsed($("evidence"), data.evidence);
      renderTrace($("trace"), data.trace);
    } else if (event === "error") {
      throw new Error(data.error.message);
    }
  }
}

async function askDual(question, k, strategy, mode, button, status) {
  // The evidence first (a retrieval is fast), then the strategy's answer (not streamed).
  busy(button, status, "retrieving…");
  const found = await (await post("/v1/retrieve", { question, k, mode })).json();
  renderUnits($("evidence"), found.units, question);
  showCoverage(found.coverage);
  status.textContent = `answering with ${strategy}…`;
  const body = await (await post("/v1/answer", { question, k, strategy, mode })).json();
  $("answer").textContent = body.answer;
  markUsed($("evidence"), body.evidence);
  renderTrace($("trace"), body.trace);
}

// ------------------------------------------------------------------ long document
async function readDocument(event) {
  event.preventDefault();
  const button = $("doc-ask"), status = $("doc-status");
  const body = { document: $("document").value, retriever: $("doc-retriever").value,
                 retrieve_only: $("doc-retrieve-only").checked };
  const question = $("doc-question").value.trim();
  if (question) body.question = question;
  const k = parseInt($("doc-k").value, 10);
  if (k) body.k = k;
  $("doc-answer").textContent = "";
  $("doc-route").textContent = "";
  $("doc-chunks").replaceChildren();
  $("doc-trace").replaceChildren();
  busy(button, status, "reading the document…");
  const t0 = performance.now();
  try {
    const res = await (await post("/v1/longcontext", body)).json();
    $("doc-answer").textContent = res.answer === null ? "(retrieve only)" : res.answer;
    if (res.route) $("doc-route").textContent = `route: ${res.route}`;
    for (const c of res.chunks) {
      $("doc-chunks").append(el("li", { class: "unit" },
        el("div", { class: "unit-head" },
          el("span", { class: "score" }, Number(c.score).toFixed(4)),
          el("span", { class: "muted small" }, `chunk ${c.position}`)),
        el("blockquote", { class: "best-chunk" }, highlighted(c.text, question))));
    }
    renderTrace($("doc-trace"), res.trace);
    busy(button, status, "");
    status.textContent = `done in ${fmtMs(performance.now() - t0)}`;
  } catch (err) {
    fail(button, status, err);
  }
}

// ------------------------------------------------------------------ start
function selectTab(tab) {
  for (const t of document.querySelectorAll('[role="tab"]')) {
    const on = t === tab;
    t.setAttribute("aria-selected", String(on));
    $(t.dataset.panel).hidden = !on;
  }
}

async function start() {
  for (const t of document.querySelectorAll('[role="tab"]')) t.addEventListener("click", () => selectTab(t));
  $("ask-form").addEventListener("submit", ask);
  $("doc-form").addEventListener("submit", readDocument);
  $("api-key").value = sessionStorage.getItem("longrag-api-key") || "";
  $("api-key").addEventListener("change", () => sessionStorage.setItem("longrag-api-key", $("api-key").value));
  try {
    const config = await (await fetch("/playground/config")).json();
    state.apiKeys = !!config.api_keys;
    $("key-field").hidden = !state.apiKeys;
  } catch (_) { /* an older app: no key field */ }
  try {
    const r = await fetch("/readyz");
    const h = r.ok ? await r.json() : (await r.json()).error.detail;
    $("health").textContent = `${h.status} · ${h.units ?? "?"} units in ${h.shards ?? "?"} shards · ${h.llm ?? "no LLM"}`;
    if (h.limits && h.limits.max_k) {
      $("k").max = h.limits.max_k;
      $("k").value = h.limits.default_k;
    }
  } catch (err) {
    $("health").textContent = `health unknown: ${err}`;
  }
  document.body.dataset.ready = "yes";
}

document.addEventListener("DOMContentLoaded", start);
