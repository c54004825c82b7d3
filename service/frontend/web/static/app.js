// The translation page: streams a translation from POST translate/stream, translates files
// through the DeepL document API, and says what went wrong in words. Plain JavaScript, no
// build step; every URL is relative, so the page works under a path prefix too.
"use strict";

const $ = (id) => document.getElementById(id);
const KEY = "hymt-api-key";
const state = { controller: null, languages: new Map() };

function apiKey() { return localStorage.getItem(KEY) || ""; }

function headers(extra = {}) {
  const key = apiKey();
  return key ? { ...extra, Authorization: `Bearer ${key}` } : extra;
}

function showError(message) { $("error").textContent = message; }

// Words for a failed request: the service's message, with what the person can do about it.
async function problem(response) {
  let message = "";
  try {
    const body = await response.json();
    message = (body.error && body.error.message) || body.message || body.error || "";
  } catch (_) { /* not JSON: the status says enough */ }
  const wait = response.headers.get("Retry-After");
  switch (response.status) {
    case 401:
      return "This service needs an API key: enter yours under “API key”.";
    case 403:
      return "The API key was not accepted. Check it under “API key”.";
    case 413:
      return "That is too large for the service. " + message;
    case 429:
      return "The service is busy or your limit is reached" +
        (wait ? `; try again in ${wait} s` : "; try again shortly") +
        (message ? ` (${message}).` : ".");
    case 503:
      return "The service is starting or unavailable; try again in a moment.";
    case 504:
      return "The translation took too long. Try a shorter text.";
    default:
      return message ? `The request failed: ${message}` : `The request failed (${response.status}).`;
  }
}

function languageName(code) { return state.languages.get(code) || code; }

async function loadLanguages() {
  const response = await fetch("languages", { headers: headers() });
  // The key box opens only when the service asks for a key (it has none to ask for otherwise).
  if (response.status === 401 || response.status === 403) $("key-box").open = true;
  if (!response.ok) { showError(await problem(response)); return; }
  const list = await response.json();
  state.languages = new Map(list.map((l) => [l.code, l.name]));
  const source = $("source"), target = $("target");
  const keepSource = source.value, keepTarget = target.value || localStorage.getItem("hymt-target");
  source.length = 1;
  target.length = 0;
  for (const language of list) {
    source.add(new Option(`${language.name} (${language.code})`, language.code));
    target.add(new Option(`${language.name} (${language.code})`, language.code));
  }
  source.value = state.languages.has(keepSource) ? keepSource : "auto";
  const preferred = (navigator.language || "en").split("-")[0];
  target.value = [keepTarget, preferred, "en"].find((c) => c && state.languages.has(c)) || list[0].code;
  showError("");
}

// Server-sent events from a fetch body: calls onEvent(name, data) for each one.
async function readEvents(response, onEvent) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let name = "message", data = "";
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) name = line.slice(6).trim();
        else if (line.startsWith("data:")) data += line.slice(5).trim();
      }
      onEvent(name, data ? JSON.parse(data) : null);
    }
  }
}

async function translate() {
  const text = $("text").value;
  if (!text.trim()) { showError("Type or paste a text to translate first."); return; }
  showError("");
  const out = $("translation");
  out.textContent = "";
  out.setAttribute("aria-busy", "true");
  $("copy").disabled = true;
  $("timing").textContent = "";
  $("detected").textContent = "";
  $("translate").disabled = true;
  $("stop").hidden = false;
  state.controller = new AbortController();
  const body = { text, target_lang: $("target").value };
  if ($("source").value !== "auto") body.source_lang = $("source").value;
  const started = performance.now();
  try {
    const response = await fetch("translate/stream", {
      method: "POST",
      headers: headers({ "Content-Type": "application/json" }),
      body: JSON.stringify(body),
      signal: state.controller.signal,
    });
    if (!response.ok) { showError(await problem(response)); return; }
    let first = null, pieces = 0;
    await readEvents(response, (name, data) => {
      if (name === "piece") {
        if (first === null) first = performance.now() - started;
        out.textContent += data.text;
        out.dataset.pieces = String(++pieces);
      } else if (name === "done") {
        out.textContent = data.translation;
        if (body.source_lang === undefined && data.source_lang) {
          const sure = data.source_lang_uncertain ? " (not sure)" : "";
          $("detected").textContent = `Detected: ${languageName(data.source_lang)}${sure}`;
        }
        const t = data.timing || {};
        const parts = [];
        if (first !== null) parts.push(`first words ${Math.round(first)} ms`);
        if (t.queue_ms !== undefined) parts.push(`queue ${Math.round(t.queue_ms)} ms`);
        if (t.inference_ms !== undefined) parts.push(`inference ${Math.round(t.inference_ms)} ms`);
        parts.push(`${data.usage.output_tokens} tokens`);
        $("timing").textContent = parts.join(" · ");
        $("copy").disabled = false;
      } else if (name === "error") {
        showError(`The translation failed: ${data.error.message}`);
      }
    });
  } catch (error) {
    if (error.name !== "AbortError") showError(`The service could not be reached (${error.message}).`);
  } finally {
    out.setAttribute("aria-busy", "false");
    $("translate").disabled = false;
    $("stop").hidden = true;
    state.controller = null;
  }
}

async function copyTranslation() {
  try {
    await navigator.clipboard.writeText($("translation").textContent);
    $("timing").textContent = "Copied.";
  } catch (_) {
    // Without clipboard access (plain HTTP), select the text for the person to copy.
    const range = document.createRange();
    range.selectNodeContents($("translation"));
    getSelection().removeAllRanges();
    getSelection().addRange(range);
  }
}

function deeplHeaders() {
  const key = apiKey();
  return key ? { Authorization: `DeepL-Auth-Key ${key}` } : {};
}

async function translateFile() {
  const file = $("file").files[0];
  if (!file) { showError("Choose a file to translate first."); return; }
  showError("");
  const progress = $("file-progress"), status = $("file-status"), link = $("download");
  link.hidden = true;
  $("translate-file").disabled = true;
  try {
    const form = new FormData();
    form.append("file", file, file.name);
    form.append("target_lang", $("target").value);
    if ($("source").value !== "auto") form.append("source_lang", $("source").value);
    const upload = await fetch("v2/document", { method: "POST", headers: deeplHeaders(), body: form });
    if (!upload.ok) { showError(await problem(upload)); status.textContent = ""; return; }
    const job = await upload.json();
    progress.hidden = false;
    progress.value = 0;
    status.textContent = "Queued…";
    for (;;) {
      await new Promise((resolve) => setTimeout(resolve, 500));
      const polled = await fetch(`v2/document/${job.document_id}`, {
        method: "POST",
        headers: { ...deeplHeaders(), "Content-Type": "application/json" },
        body: JSON.stringify({ document_key: job.document_key }),
      });
      if (!polled.ok) { showError(await problem(polled)); return; }
      const s = await polled.json();
      if (s.status === "error") { showError(`The file could not be translated: ${s.error_message}`); status.textContent = ""; return; }
      if (s.status === "done") break;
      status.textContent = s.seconds_remaining !== undefined ? `Translating… about ${s.seconds_remaining} s left` : "Translating…";
      if (s.seconds_remaining !== undefined) progress.value = Math.min(95, progress.value + 5);
    }
    const result = await fetch(`v2/document/${job.document_id}/result`, {
      method: "POST",
      headers: { ...deeplHeaders(), "Content-Type": "application/json" },
      body: JSON.stringify({ document_key: job.document_key }),
    });
    if (!result.ok) { showError(await problem(result)); return; }
    const blob = await result.blob();
    const dot = file.name.lastIndexOf(".");
    const name = dot > 0 ? `${file.name.slice(0, dot)}_${$("target").value}${file.name.slice(dot)}` : file.name;
    if (link.href) URL.revokeObjectURL(link.href);
    link.href = URL.createObjectURL(blob);
    link.download = name;
    link.textContent = `Download translation (${name})`;
    link.hidden = false;
    progress.value = 100;
    status.textContent = "Done.";
    link.focus();
  } catch (error) {
    showError(`The service could not be reached (${error.message}).`);
  } finally {
    $("translate-file").disabled = false;
  }
}

function swap() {
  const source = $("source"), target = $("target");
  if (source.value === "auto") return;
  [source.value, target.value] = [target.value, source.value];
  const out = $("translation").textContent;
  if (out) { $("text").value = out; $("translation").textContent = ""; }
}

function start() {
  $("api-key").value = apiKey();
  $("save-key").addEventListener("click", () => {
    localStorage.setItem(KEY, $("api-key").value.trim());
    loadLanguages();
  });
  $("api-key").addEventListener("keydown", (e) => { if (e.key === "Enter") $("save-key").click(); });
  $("translate").addEventListener("click", translate);
  $("stop").addEventListener("click", () => state.controller && state.controller.abort());
  $("copy").addEventListener("click", copyTranslation);
  $("translate-file").addEventListener("click", translateFile);
  $("swap").addEventListener("click", swap);
  $("target").addEventListener("change", () => localStorage.setItem("hymt-target", $("target").value));
  $("text").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); translate(); }
  });
  $("text").addEventListener("input", () => { $("count").textContent = `${$("text").value.length} characters`; });
  loadLanguages();
}

document.addEventListener("DOMContentLoaded", start);
