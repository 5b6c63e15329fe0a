// d2s-search page: plain JS, no build step. Talks to the JSON API under api/. Every URL is
// relative to the page, so the app also works mounted under a prefix (/photos/).
"use strict";

const $ = (sel) => document.querySelector(sel);
const BARS_SHOWN = 40; // words in the detail bar chart before "show more"
const BARS_MAX = 500; // a cap for untrained heads that give thousands of words
const QUERY_TERMS_SHOWN = 24;

// Everything goes through el(): text is always set as text, never parsed as HTML.
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "style") for (const [prop, v] of Object.entries(value)) node.style.setProperty(prop, v);
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "dataset") Object.assign(node.dataset, value);
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined) node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

const fmt = (x, digits = 3) => (Math.abs(x) >= 100 ? x.toFixed(1) : x.toFixed(digits));
const bytes = (n) => (n == null ? "—" : n > 1e9 ? `${(n / 1e9).toFixed(2)} GB` : n > 1e6 ? `${(n / 1e6).toFixed(1)} MB` : `${Math.round(n / 1e3)} kB`);

// --- state ----------------------------------------------------------------------------

const state = { controller: null, last: null, picture: null, pictures: [], queryTerms: [], searches: 0 };
window.d2s = { timings: [] }; // read by the browser tests and the benchmark

function options() {
  const form = $("#search");
  const params = new URLSearchParams();
  params.set("mode", form.mode.value);
  params.set("k", $("#k").value.trim());
  if (form.mode.value === "hybrid") {
    params.set("fusion", $("#fusion").value);
    params.set("alpha", $("#alpha").value);
  }
  return params;
}

function setOptions(params) {
  const mode = params.get("mode");
  const radio = document.querySelector(`input[name=mode][value="${CSS.escape(mode || "sparse")}"]`);
  if (radio) radio.checked = true;
  if (params.get("k")) $("#k").value = params.get("k");
  if (params.get("fusion")) $("#fusion").value = params.get("fusion");
  if (params.get("alpha")) $("#alpha").value = params.get("alpha");
  syncHybrid();
}

function syncHybrid() {
  $("#hybrid-options").hidden = $("#search").mode.value !== "hybrid";
  $("#alpha-out").textContent = $("#alpha").value;
}

// --- talking to the API -----------------------------------------------------------------

async function api(url, init = {}) {
  const response = await fetch(url, init);
  let body = null;
  try {
    body = await response.json();
  } catch {
    /* not JSON: handled below */
  }
  if (!response.ok) {
    const message = body && body.detail ? body.detail : `the server answered ${response.status}`;
    throw Object.assign(new Error(message), { status: response.status });
  }
  return body;
}

// One search at a time: a new one aborts the one still running, so late answers never win.
async function run(kind, url, init = {}, label = "") {
  if (state.controller) state.controller.abort();
  const controller = (state.controller = new AbortController());
  const started = performance.now();
  const grid = $("#grid");
  $("#hello").hidden = true;
  grid.dataset.state = "loading";
  grid.dataset.images = "pending";
  grid.setAttribute("aria-busy", "true");
  showMessage("");
  try {
    const data = await api(url, { ...init, signal: controller.signal });
    const answered = performance.now();
    render(data, label);
    await nextPaint();
    const rendered = performance.now();
    const timing = { kind, mode: data.mode, results: data.results.length, request_ms: answered - started,
                     render_ms: rendered - started, server_ms: data.encode_ms + data.search_ms };
    window.d2s.timings.push(timing);
    imagesLoaded(grid).then(() => { timing.images_ms = performance.now() - started; grid.dataset.images = "loaded"; });
  } catch (err) {
    if (err.name === "AbortError") return;
    grid.dataset.state = "error";
    showMessage(err.message, "error");
  } finally {
    if (state.controller === controller) {
      state.controller = null;
      grid.removeAttribute("aria-busy");
    }
    state.searches += 1;
    document.body.dataset.searches = String(state.searches);
  }
}

const nextPaint = () => new Promise((resolve) => requestAnimationFrame(() => setTimeout(resolve, 0)));

function imagesLoaded(root) {
  const pending = [...root.querySelectorAll("img")].filter((img) => !img.complete);
  return Promise.all(pending.map((img) => new Promise((ok) => { img.onload = img.onerror = ok; })));
}

// Every search is a step in the browser's history (its query in the address), so Back and
// Forward step through searches; a step restored from history replaces, never adds.
function go(url, push, entry = null) {
  const target = new URL(url, location.href);
  if (push && target.pathname + target.search !== location.pathname + location.search) history.pushState(entry, "", url);
  else history.replaceState(entry, "", url);
}

function searchText(event, push = true) {
  if (event) event.preventDefault();
  const q = $("#q").value.trim();
  if (!q) {
    $("#grid").dataset.state = "empty";
    $("#hello").hidden = true;
    showMessage("Type some words to search, or drop a picture anywhere on the page.", "info");
    return;
  }
  const params = options();
  params.set("q", q);
  go(`./?${params}`, push);
  run("text", `api/search?${params}`, {}, `“${q}”`);
}

function searchPicture(file, push = true) {
  if (!file) return;
  if (file.type && !file.type.startsWith("image/")) {
    showMessage(`${file.name} is not a picture: drop a JPEG, PNG, WebP or GIF file.`, "error");
    return;
  }
  const body = new FormData();
  body.append("image", file, file.name || "picture");
  state.picture = file; // kept so a mode switch can search by it again
  $("#q").value = "";
  // Its history entry names the picture, kept here: Back or Forward to it searches by it again.
  let n = state.pictures.indexOf(file);
  if (n < 0) n = state.pictures.push(file) - 1;
  go(`./?${options()}`, push, { picture: n });

  run("image", `api/search/image?${options()}`, { method: "POST", body }, `the picture ${file.name || ""}`);
}

function searchSimilar(id, name, push = true) {
  const params = options();
  $("#q").value = "";
  go(`./?like=${encodeURIComponent(id)}&${params}`, push);
  run("similar", `api/documents/${encodeURIComponent(id)}/similar?${params}`, {}, `more like ${name}`);
}

// --- rendering results --------------------------------------------------------------------

function showMessage(text, kind = "info") {
  const box = $("#message");
  box.hidden = !text;
  box.textContent = text;
  box.className = `message ${kind}`;
  if (text) {
    $("#summary").replaceChildren();
    if (kind === "error") {
      $("#grid").replaceChildren();
      $("#query-terms").replaceChildren();
      renderNotice(null);
    }
  }
}

function render(data, label) {
  state.last = data;
  state.queryTerms = data.query_terms;
  const grid = $("#grid");
  const took = data.encode_ms ? `${fmt(data.encode_ms, 1)} ms encoding + ${fmt(data.search_ms, 1)} ms search`
                              : `${fmt(data.search_ms, 1)} ms search`;
  $("#summary").replaceChildren(
    el("span", { class: "count" }, `${data.results.length} result${data.results.length === 1 ? "" : "s"}`),
    ` for ${label} · `, el("span", { class: "mode-label" }, data.mode), ` · ${took}`,
  );
  renderQueryTerms(data.query_terms, data.query.kind, data.query_edits);
  renderNotice(data.notice);
  if (!data.results.length) {
    grid.replaceChildren();
    grid.dataset.state = "done";
    showMessage(data.mode === "two-phase"
      ? "No picture has any of the query's own words. Try sparse or dense mode."
      : "No picture matched. Try other words, or dense mode.", "info");
    return;
  }
  // Chip sizes share one scale over the page, so a big word means a big contribution anywhere.
  const top = Math.max(1e-9, ...data.results.flatMap((r) => r.matched.map((m) => m.contribution)));
  grid.replaceChildren(...data.results.map((r) => card(r, top)));
  grid.dataset.state = "done";
  grid.dataset.mode = data.mode;
}

// A query the model does not understand (no word it knows) still gets pictures: say that
// they are guesses, next to the results rather than instead of them.
function renderNotice(text) {
  const box = $("#notice");
  if (!box) return;
  box.hidden = !text;
  box.textContent = text || "";
}

function renderQueryTerms(terms, kind, edits = null) {
  const shown = terms.slice(0, QUERY_TERMS_SHOWN);
  const box = $("#query-terms");
  box.classList.add("collapsed");
  const excluded = (edits && edits.excluded) || [];
  if (!shown.length && !excluded.length) {
    box.replaceChildren();
    return fitQueryTerms();
  }
  const top = Math.max(1e-9, ...shown.map((t) => t.weight));
  // A text query's words can be edited in place: each edit rewrites the query text in its own
  // syntax (-word, word^N) and searches again, so the box, the address and Back show it.
  const editable = kind === "text";
  box.replaceChildren(
    el("span", { class: "label" }, kind === "text" ? "query words" : "its words"),
    ...shown.map((t) => queryWord(t, top, editable)),
    ...excluded.map((term) => el("span", { class: "qword", dataset: { term } },
      el("span", { class: "chip q excluded", title: `${term}: removed, and pictures carrying it left out` }, term),
      editable ? editButton(term, "restore", "↺", `put ${term} back`) : null)),
  );
  fitQueryTerms();
}

const EDITABLE_TERM = /^[\p{L}\p{N}]+$/u; // whole words: not word pieces (##s) or punctuation

function queryWord(t, top, editable) {
  const chip = el("span", {
    class: `chip q${t.own ? " own" : ""}`, title: `${t.term}: weight ${fmt(t.weight)}${t.own ? " (typed)" : " (expansion)"}`,
    style: { "--w": (t.weight / top).toFixed(3) },
  }, t.term);
  if (!editable || !EDITABLE_TERM.test(t.term)) return chip;
  return el("span", { class: "qword", dataset: { term: t.term } }, chip,
    editButton(t.term, 2, "+", `weigh ${t.term} up`),
    editButton(t.term, 0.5, "−", `weigh ${t.term} down`),
    editButton(t.term, "remove", "×", `remove ${t.term} and the pictures carrying it`));
}

function editButton(term, action, text, label) {
  return el("button", {
    type: "button", class: "act", "aria-label": label, title: label, dataset: { act: String(action) },
    onclick: () => {
      $("#q").value = editedQuery($("#q").value, term, action);
      searchText(null, true);
    },
  }, text);
}

// The query text with one edit applied: "remove" drops +term and term^N and adds -term;
// "restore" drops -term; a number multiplies the word's weight (term^N, added if untyped).
function editedQuery(text, term, action) {
  const escaped = term.replace(/[.*+?^$|()[\]{}\\]/g, "\\$&");
  const pattern = new RegExp(`^([+-]?)${escaped}(?:\\^([0-9.]+))?$`, "iu");
  const words = text.trim().split(/\s+/).filter(Boolean);
  const match = (w) => w.match(pattern);
  if (action === "restore") return words.filter((w) => !(match(w) && match(w)[1] === "-")).join(" ");
  if (action === "remove") {
    const kept = words.filter((w) => !(match(w) && (match(w)[1] === "+" || match(w)[2] !== undefined)));
    return kept.some((w) => match(w) && match(w)[1] === "-") ? kept.join(" ") : [...kept, `-${term}`].join(" ");
  }
  let found = false;
  const out = words.map((w) => {
    const m = match(w);
    if (!m || m[1] === "-" || found) return w;
    found = true;
    const weight = Math.min(100, Math.round((m[2] ? parseFloat(m[2]) : 1) * action * 100) / 100);
    return `${m[1]}${term}${weight === 1 ? "" : `^${weight}`}`;
  });
  if (!found) out.push(`${term}^${Math.min(100, action)}`);
  return out.join(" ");
}
window.d2s.editedQuery = editedQuery; // the browser tests check the rewriting rules directly

// On a narrow screen the query's words keep to one row (the first pictures stay in view);
// "more words" shows the rest.
function fitQueryTerms() {
  const box = $("#query-terms");
  const more = $("#query-terms-more");
  const collapsed = box.classList.contains("collapsed");
  more.hidden = collapsed ? box.scrollHeight <= box.clientHeight + 1 : false;
  more.textContent = collapsed ? "more words" : "fewer words";
  more.setAttribute("aria-expanded", String(!collapsed));
}

function toggleQueryTerms() {
  $("#query-terms").classList.toggle("collapsed");
  fitQueryTerms();
}

// Long file names wrap after a separator (/ _ - . space), not inside a word; a piece longer
// than the line still wraps (overflow-wrap in the style sheet).
function breakable(text) {
  return String(text).split(/(?<=[/\\_\-. ])/).flatMap((part, i) => (i ? [el("wbr"), part] : [part]));
}

function card(r, top) {
  const open = () => openDetail(r.id);
  return el("article", { class: "card", dataset: { id: r.id, rank: r.rank } },
    el("button", { class: "thumb", type: "button", onclick: open, title: `Open ${r.name}` },
      el("img", { src: r.thumbnail, alt: r.name, loading: "lazy", onerror: (e) => e.target.classList.add("broken") })),
    el("div", { class: "meta" },
      el("span", { class: "rank" }, `#${r.rank}`),
      el("span", { class: "score", title: partsTitle(r) }, fmt(r.score)),
      el("span", { class: "name", title: r.path }, r.name)),
    el("div", { class: "chips" }, r.matched.map((m) => chip(m, top))),
  );
}

function chip(m, top) {
  const w = Math.max(0, m.contribution / top);
  return el("span", {
    class: "chip", title: `${m.term}: adds ${fmt(m.contribution)}`,
    style: { "--w": w.toFixed(3), "font-size": `${(0.72 + 0.36 * w).toFixed(3)}rem` },
  }, m.term);
}

function partsTitle(r) {
  if (!r.parts) return "score";
  return Object.entries(r.parts).map(([k, v]) => `${k} ${fmt(v)}`).join(", ");
}

// --- detail view ------------------------------------------------------------------------

async function openDetail(id) {
  const dialog = $("#detail");
  let doc;
  try {
    doc = await api(`api/documents/${id}`);
  } catch (err) {
    showMessage(err.message, "error");
    return;
  }
  $("#d-img").src = doc.preview;
  $("#d-img").alt = doc.name;
  $("#d-name").replaceChildren(...breakable(doc.name));
  $("#d-path").replaceChildren(...breakable(doc.path));
  $("#d-original").href = /^https?:\/\//i.test(doc.url || "") ? doc.url : `api/documents/${encodeURIComponent(doc.id)}/original`;
  const results = state.last ? state.last.results : [];
  const at = results.findIndex((r) => r.id === doc.id);
  $("#d-prev").disabled = at <= 0;
  $("#d-next").disabled = at < 0 || at >= results.length - 1;
  $("#d-position").textContent = at < 0 ? "" : `${at + 1} of ${results.length}`;
  $("#d-caption").textContent = `${doc.width} × ${doc.height} px · ${bytes(doc.size_bytes)}` +
    (doc.ingested_at ? ` · indexed ${doc.ingested_at.replace("T", " ").replace("Z", " UTC")}` : "");
  $("#d-more").onclick = () => { dialog.close(); searchSimilar(doc.id, doc.name); };
  dialog.dataset.id = doc.id;

  const weights = new Map(doc.terms.map((t) => [t.term, t.weight]));
  const queryWeights = new Map(state.queryTerms.map((t) => [t.term, t.weight]));
  $("#d-query").hidden = !state.queryTerms.length;
  $("#d-query-terms").replaceChildren(...state.queryTerms.slice(0, QUERY_TERMS_SHOWN).map((t) => {
    const w = weights.get(t.term);
    return el("span", {
      class: `chip q${w ? " hit" : ""}`,
      title: w ? `${t.term}: in the picture, adds ${fmt(t.weight * w)}` : `${t.term}: not in the picture`,
    }, t.term);
  }));
  $("#d-count").textContent = `(${doc.term_count})`;
  const top = doc.terms.length ? doc.terms[0].weight : 1;
  const bars = (n) => $("#d-bars").replaceChildren(...doc.terms.slice(0, n).map((t) => el("div", {
    class: `bar-row${queryWeights.has(t.term) ? " in-query" : ""}`, title: `${t.term}: ${fmt(t.weight, 4)}`,
  }, el("span", { class: "term" }, t.term),
     el("span", { class: "bar" }, el("span", { style: { width: `${(100 * t.weight / top).toFixed(1)}%` } })),
     el("span", { class: "value" }, fmt(t.weight)))));
  bars(BARS_SHOWN);
  const more = $("#d-all");
  more.hidden = doc.terms.length <= BARS_SHOWN;
  more.textContent = doc.terms.length > BARS_MAX ? `Show the top ${BARS_MAX} words` : `Show all ${doc.terms.length} words`;
  more.onclick = () => { bars(BARS_MAX); more.hidden = true; };
  if (!dialog.open) dialog.showModal();
}

// ← and → (or the buttons) step through the results without closing the picture.
function stepDetail(by) {
  const results = state.last ? state.last.results : [];
  const at = results.findIndex((r) => r.id === $("#detail").dataset.id);
  const next = at < 0 ? null : results[at + by];
  if (next) openDetail(next.id);
}

// --- status -----------------------------------------------------------------------------

async function loadStatus() {
  const s = await api("api/status");
  $("#footer").textContent = `${s.documents ?? "?"} pictures · ${s.bundle.model} · ${s.backend}` +
    (s.last_ingest_at ? ` · last ingest ${s.last_ingest_at.replace("T", " ").replace("Z", " UTC")}` : "");
  $("#k").max = s.k_max;
  return s;
}

async function openStatus() {
  const dialog = $("#status");
  let s;
  try {
    s = await loadStatus();
  } catch (err) {
    showMessage(err.message, "error");
    return;
  }
  const rows = [
    ["Pictures", s.documents], ["Distinct words", s.distinct_terms], ["Words per picture", s.mean_terms_per_document],
    ["Backend", s.backend], ["Location", s.location], ["Model", s.bundle.model],
    ["Head", s.bundle.head_trained ? "trained" : "untrained (vocabulary init)"],
    ["Bundle fingerprint", s.bundle.fingerprint], ["Bundle", s.bundle.path],
    ["Dense dims / vocabulary", `${s.bundle.dense_dim} / ${s.bundle.vocab_size}`],
    ["Created", s.created_at], ["Last ingest", s.last_ingest_at], ["Size on disk", bytes(s.disk_bytes)],
  ];
  $("#s-list").replaceChildren(...rows.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, ...breakable(v ?? "—"))]));
  if (!dialog.open) dialog.showModal();
}

// --- drag and drop, paste -----------------------------------------------------------------

function setUpDrop() {
  const overlay = $("#drop");
  let depth = 0;
  const hasFiles = (e) => [...(e.dataTransfer?.types || [])].includes("Files");
  window.addEventListener("dragenter", (e) => { if (hasFiles(e)) { depth += 1; overlay.hidden = false; } });
  window.addEventListener("dragleave", () => { depth = Math.max(0, depth - 1); if (!depth) overlay.hidden = true; });
  window.addEventListener("dragover", (e) => { if (hasFiles(e)) e.preventDefault(); });
  window.addEventListener("drop", (e) => {
    if (!hasFiles(e)) return;
    e.preventDefault();
    depth = 0;
    overlay.hidden = true;
    searchPicture(e.dataTransfer.files[0]);
  });
  window.addEventListener("paste", (e) => {
    const file = [...(e.clipboardData?.files || [])].find((f) => f.type.startsWith("image/"));
    if (file) { e.preventDefault(); searchPicture(file); }
  });
}

// --- start --------------------------------------------------------------------------------

function start() {
  const form = $("#search");
  form.addEventListener("submit", searchText);
  // Switching mode re-runs the search on screen, so the difference is visible at once.
  form.addEventListener("change", (e) => {
    if (e.target.id === "file") return;
    syncHybrid();
    if (e.target.name === "mode" || e.target.name === "fusion" || e.target.name === "alpha") rerun();
  });
  $("#alpha").addEventListener("input", syncHybrid);
  $("#file").addEventListener("change", (e) => { searchPicture(e.target.files[0]); e.target.value = ""; });
  $("#status-button").addEventListener("click", openStatus);
  $("#query-terms-more").addEventListener("click", toggleQueryTerms);
  $("#d-prev").addEventListener("click", () => stepDetail(-1));
  $("#d-next").addEventListener("click", () => stepDetail(1));
  window.addEventListener("resize", fitQueryTerms);
  window.addEventListener("popstate", (e) => restore(new URLSearchParams(location.search), e.state));
  document.addEventListener("keydown", onKey);
  for (const dialog of document.querySelectorAll("dialog")) {
    dialog.addEventListener("click", (e) => { if (e.target === dialog) dialog.close(); }); // click outside closes
  }
  setUpDrop();
  loadStatus().catch((err) => showMessage(`The index cannot be read: ${err.message}`, "error"));

  restore(new URLSearchParams(location.search), history.state);
  document.body.dataset.ready = "true";
}

// The search an address (and its history entry) stands for, run again without a new entry.
function restore(params, entry) {
  setOptions(params);
  for (const dialog of document.querySelectorAll("dialog[open]")) dialog.close();
  if (params.get("q") !== null) {
    $("#q").value = params.get("q");
    searchText(null, false);
  } else if (params.get("like")) {
    searchSimilar(params.get("like"), "this picture", false);
  } else if (entry && state.pictures[entry.picture]) {
    searchPicture(state.pictures[entry.picture], false);
  } else if (state.last || state.searches) {
    // Back to the start page
    if (state.controller) state.controller.abort();
    state.last = null;
    $("#q").value = "";
    showMessage("");
    $("#grid").replaceChildren();
    $("#grid").dataset.state = "idle";
    $("#query-terms").replaceChildren();
    fitQueryTerms();
    renderNotice(null);
    $("#hello").hidden = false;
  }
}

// "/" puts the cursor in the search box (unless one is typing somewhere already); ← and →
// step through the results in the picture view.
function onKey(e) {
  if (e.ctrlKey || e.metaKey || e.altKey) return;
  const target = e.target;
  const typing = target instanceof HTMLElement && (target.isContentEditable || target.tagName === "TEXTAREA" ||
    target.tagName === "SELECT" || (target.tagName === "INPUT" && !["radio", "checkbox", "range", "button", "submit",
      "file"].includes(target.type)));
  if ($("#detail").open) {
    if (e.key === "ArrowLeft" || e.key === "ArrowRight") {
      e.preventDefault();
      stepDetail(e.key === "ArrowLeft" ? -1 : 1);
    }
    return;
  }
  if (e.key === "/" && !typing && !document.querySelector("dialog[open]")) {
    e.preventDefault();
    $("#q").focus();
    $("#q").select();
  }
}

function rerun() {
  const last = state.last;
  if ($("#q").value.trim()) searchText();
  else if (!last) return;
  else if (last.query.kind === "document") searchSimilar(last.query.id, last.query.filename || "this picture");
  else if (last.query.kind === "image" && state.picture) searchPicture(state.picture);
}

document.addEventListener("DOMContentLoaded", start);
