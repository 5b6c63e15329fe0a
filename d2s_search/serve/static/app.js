// d2s-search page: plain JS, no build step. Talks to the JSON API under api/. Every URL is
// relative to the page, so the app also works mounted under a prefix (/photos/).
"use strict";

const $ = (sel) => document.querySelector(sel);
const BARS_SHOWN = 40; // words in the detail bar chart before "show more"
const BARS_MAX = 500; // a cap for untrained heads that give thousands of words
const QUERY_TERMS_SHOWN = 24;
const FACET_SIZE = 12; // values listed per facet
const DAY_MS = 86400000;
const PLAIN_DAY = /^\d{4}-\d{2}-\d{2}$/;
const CONDITION = /^\s*([A-Za-z][A-Za-z0-9_]*)\s*(!=|>=|<=|=|>|<)(.*)$/s;

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

const state = {
  controller: null, last: null, picture: null, pictures: [], queryTerms: [], queryWords: [], searches: 0,
  actions: 0, // user actions that show something: a pending start view gives way to them
  status: null, // the promise of the first /api/status answer (null when it failed)
  canFilter: false, // the index keeps dates, cameras, places and fields
  filters: noFilters(), facetsKey: null, facetsController: null, facetLoads: 0,
};
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
  return filterParams(params);
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
  let superseded = false;
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
    if (err.name === "AbortError") {
      superseded = true; // a newer search took its place: that one is counted when it ends
      return;
    }
    grid.dataset.state = "error";
    showMessage(err.message, "error");
  } finally {
    if (state.controller === controller) {
      state.controller = null;
      grid.removeAttribute("aria-busy");
    }
    if (!superseded) {
      state.searches += 1;
      document.body.dataset.searches = String(state.searches);
    }
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
  state.actions += 1;
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
  return run("text", `api/search?${params}`, {}, `“${q}”`);
}

function searchPicture(file, push = true) {
  if (!file) return;
  if (file.type && !file.type.startsWith("image/")) {
    showMessage(`${file.name} is not a picture: drop a JPEG, PNG, WebP or GIF file.`, "error");
    return;
  }
  state.actions += 1;
  const body = new FormData();
  body.append("image", file, file.name || "picture");
  state.picture = file; // kept so a mode switch can search by it again
  $("#q").value = "";
  // Its history entry names the picture, kept here: Back or Forward to it searches by it again.
  let n = state.pictures.indexOf(file);
  if (n < 0) n = state.pictures.push(file) - 1;
  go(`./?${options()}`, push, { picture: n });

  return run("image", `api/search/image?${options()}`, { method: "POST", body }, `the picture ${file.name || ""}`);
}

function searchSimilar(id, name, push = true) {
  state.actions += 1;
  const params = options();
  $("#q").value = "";
  go(`./?like=${encodeURIComponent(id)}&${params}`, push);
  return run("similar", `api/documents/${encodeURIComponent(id)}/similar?${params}`, {}, `more like ${name}`);
}

// The library: no query, the pictures that pass the filters, the most recently taken first.
function showLibrary(push = true) {
  state.actions += 1;
  state.picture = null;
  $("#q").value = "";
  go(`./?${options()}`, push);
  const query = filterParams();
  query.set("k", $("#k").value.trim());
  return run("library", `api/library?${query}`, {}, "the library");
}

async function moreOfTheLibrary() {
  const last = state.last;
  if (!last || last.query.kind !== "library") return;
  const query = filterParams();
  query.set("k", String(last.k));
  query.set("offset", String((last.offset || 0) + last.results.length));
  const button = $("#more");
  button.disabled = true;
  try {
    const data = await api(`api/library?${query}`);
    if (state.last !== last) return; // another search replaced the grid meanwhile
    last.results.push(...data.results);
    $("#grid").append(...data.results.map((r) => card(r, 1, true)));
    button.hidden = data.results.length < last.k;
    $("#summary .count").textContent = pictures(last.results.length);
  } catch (err) {
    showMessage(err.message, "error");
  } finally {
    button.disabled = false;
  }
}

// --- filters ------------------------------------------------------------------------------
// after / before are dates as the API takes them (before is exclusive); the "to" box shows the
// last day included, so "from 2019-06-01 to 2019-06-30" is June.

function noFilters() {
  return { after: null, before: null, folders: [], where: [], near: null };
}

function readFilters(params) {
  return {
    after: params.get("after") || null, before: params.get("before") || null,
    folders: params.getAll("folder").filter(Boolean), where: params.getAll("where").filter(Boolean),
    near: params.get("near") || null,
  };
}

// ``leaveOut``: a field whose own choices are left out ("folder", or a field's = conditions).
function filterParams(params = new URLSearchParams(), leaveOut = null) {
  const f = state.filters;
  if (f.after) params.set("after", f.after);
  if (f.before) params.set("before", f.before);
  if (leaveOut !== "folder") for (const folder of f.folders) params.append("folder", folder);
  for (const condition of f.where) if (!leaveOut || chosenField(condition) !== leaveOut) params.append("where", condition);
  if (f.near) params.set("near", f.near);
  return params;
}

// The field a facet choice (field=value) is about, else null.
function chosenField(condition) {
  const m = condition.match(CONDITION);
  return m && m[2] === "=" ? m[1] : null;
}

const shiftDay = (day, by) => new Date(Date.parse(`${day}T00:00:00Z`) + by * DAY_MS).toISOString().slice(0, 10);

function syncFilterInputs() {
  const f = state.filters;
  $("#f-from").value = f.after && PLAIN_DAY.test(f.after) ? f.after : "";
  $("#f-to").value = f.before && PLAIN_DAY.test(f.before) ? shiftDay(f.before, -1) : "";
  $("#f-near").value = f.near || "";
  if (f.near) $("#f-place").hidden = false;
}

// Every change of a filter re-runs what is on screen (a search, or the library) as a new step
// in the history, and counts the facets again.
function applyFilters() {
  renderActiveFilters();
  loadFacets();
  rerun(true);
}

function conditionText(condition) {
  const m = condition.match(CONDITION);
  return m ? `${m[1]} ${m[2]} ${m[3].trim()}` : condition;
}

function takenText(f) {
  const shown = (time) => time.replace("T", " ");
  const last = f.before && PLAIN_DAY.test(f.before) ? shiftDay(f.before, -1) : null; // the last day included
  const upper = f.before ? (last ? `to ${last}` : `before ${shown(f.before)}`) : "";
  if (f.after) return `taken from ${shown(f.after)}${upper ? ` ${upper}` : ""}`;
  return last ? `taken up to ${last}` : `taken ${upper}`;
}

// The active filters as (text, kind, how to remove it): the chips, and the summary's "only ...".
function activeFilters() {
  const f = state.filters;
  const out = [];
  if (f.after || f.before) out.push([takenText(f), "taken", () => { f.after = f.before = null; }]);
  for (const folder of f.folders) out.push([`in ${folder}`, "folder", () => { f.folders = f.folders.filter((x) => x !== folder); }]);
  for (const condition of f.where) {
    out.push([conditionText(condition), "where", () => { f.where = f.where.filter((x) => x !== condition); }]);
  }
  if (f.near) {
    const [lat, lon, km] = f.near.split(",").map((x) => x.trim());
    out.push([km !== undefined ? `within ${km} km of ${lat},${lon}` : `near ${f.near}`, "near", () => { f.near = null; }]);
  }
  return out;
}

function renderActiveFilters() {
  const chips = activeFilters().map(([text, kind, remove]) => filterChip(text, kind, remove));
  if (chips.length > 1) {
    chips.push(el("button", { type: "button", class: "button quiet clear-filters",
      onclick: () => { state.filters = noFilters(); applyFilters(); } }, "clear all"));
  }
  $("#active-filters").replaceChildren(...chips);
  syncFilterInputs();
}

// An active filter, like a query word: its text and a button that removes it.
function filterChip(text, kind, remove) {
  return el("span", { class: "qword filter", dataset: { kind } },
    el("span", { class: "chip q" }, text),
    el("button", { type: "button", class: "act", "aria-label": `remove the filter ${text}`, title: `remove: ${text}`,
      onclick: () => { remove(); applyFilters(); } }, "×"));
}

function facetActive(field, value) {
  return field === "folder" ? state.filters.folders.includes(value) : state.filters.where.includes(`${field}=${value}`);
}

function toggleFacet(field, value) {
  const f = state.filters;
  if (field === "folder") {
    f.folders = facetActive(field, value) ? f.folders.filter((x) => x !== value) : [...f.folders, value];
  } else {
    const condition = `${field}=${value}`;
    f.where = facetActive(field, value) ? f.where.filter((x) => x !== condition) : [...f.where, condition];
  }
  applyFilters();
}

// Counts of the pictures that pass the filters, by folder, camera and each field of the user's.
// A field with values chosen is counted without its own choices, as the alternatives they are
// (camera=A and camera=B: either), so its other values stay there to add.
async function loadFacets() {
  const status = await state.status;
  if (!status || !status.filters) return;
  const query = filterParams();
  query.set("size", String(FACET_SIZE));
  const key = query.toString();
  if (key === state.facetsKey) return;
  state.facetsKey = key;
  if (state.facetsController) state.facetsController.abort();
  const controller = (state.facetsController = new AbortController());
  const chosen = new Set([...(state.filters.folders.length ? ["folder"] : []),
                          ...state.filters.where.map(chosenField).filter(Boolean)]);
  const counted = (params) => {
    params.set("size", String(FACET_SIZE));
    return api(`api/facets?${params}`, { signal: controller.signal });
  };
  try {
    const [data, ...alone] = await Promise.all([counted(filterParams()),
      ...[...chosen].map((field) => counted(filterParams(new URLSearchParams(), field)))]);
    [...chosen].forEach((field, i) => { if (field in alone[i].fields) data.fields[field] = alone[i].fields[field]; });
    renderFacets(data);
  } catch (err) {
    if (err.name === "AbortError") return;
    state.facetsKey = null;
    $("#facets").replaceChildren(); // a bad filter: the search beside says what is wrong
  }
  state.facetsController = null;
  state.facetLoads += 1;
  document.body.dataset.facets = String(state.facetLoads);
}

function renderFacets(data) {
  $("#f-place").hidden = !(data.located || state.filters.near);
  const fields = Object.keys(data.fields).filter((n) => n !== "folder" && n !== "camera").sort();
  const names = ["folder", "camera", ...fields].filter((n) => (data.fields[n] || []).length);
  $("#facets").replaceChildren(...names.map((name) => facetGroup(name, data.fields[name])));
}

function facetGroup(name, values) {
  const id = `facet-${name}`;
  const labels = name === "folder" ? folderLabels(values.map((v) => v.value)) : values.map((v) => v.value);
  return el("div", { class: "facet", role: "group", "aria-labelledby": id, dataset: { field: name } },
    el("span", { class: "facet-name", id }, name),
    ...values.map((v, i) => el("button", {
      type: "button", class: "facet-value", "aria-pressed": String(facetActive(name, v.value)), dataset: { value: v.value },
      title: `${name === "folder" ? v.value : `${name} = ${v.value}`}: ${pictures(v.count)}`,
      onclick: () => toggleFacet(name, v.value),
    }, labels[i], " ", el("span", { class: "count" }, String(v.count)))));
}

// Folders by what tells them apart: the part after the folder they all share.
function folderLabels(paths) {
  const split = paths.map((p) => p.split("/"));
  let common = 0;
  if (paths.length > 1) {
    while (split.every((s) => common < s.length - 1 && s[common] === split[0][common])) common += 1;
  } else {
    common = Math.max(0, split[0].length - 1);
  }
  return split.map((s, i) => s.slice(common).join("/") || paths[i]);
}

const pictures = (n) => `${n} picture${n === 1 ? "" : "s"}`;

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
  state.queryTerms = data.query_terms; // raw vocabulary terms: what a picture's terms are matched against
  state.queryWords = shownWords(data);
  const grid = $("#grid");
  const library = data.query.kind === "library";
  const took = data.encode_ms ? `${fmt(data.encode_ms, 1)} ms encoding + ${fmt(data.search_ms, 1)} ms search`
                              : `${fmt(data.search_ms, 1)} ms ${library ? "listing" : "search"}`;
  $("#summary").replaceChildren(...[
    el("span", { class: "count" }, library ? pictures(data.results.length)
                                           : `${data.results.length} result${data.results.length === 1 ? "" : "s"}`),
    library ? " · the library, newest first · " : ` for ${label} · `,
    library ? null : el("span", { class: "mode-label" }, data.mode), library ? null : " · ",
    data.filters ? el("span", { class: "only" }, `only ${activeFilters().map(([text]) => text).join(", ")} · `) : null, took,
  ].filter((part) => part !== null));
  renderQueryTerms(state.queryWords, data.query.kind, data.query_edits);
  renderNotice(data.notice);
  $("#more").hidden = !(library && data.results.length === data.k);
  grid.dataset.mode = data.mode;
  if (!data.results.length) {
    grid.replaceChildren();
    grid.dataset.state = "done";
    showMessage(library ? (data.filters ? "No picture passes these filters: remove one." : "The index has no pictures yet.")
      : data.filters ? "No picture matched within these filters. Remove a filter, or try other words."
      : data.mode === "two-phase" ? "No picture has any of the query's own words. Try sparse or dense mode."
      : "No picture matched. Try other words, or dense mode.", "info");
    return;
  }
  // Chip sizes share one scale over the page, so a big word means a big contribution anywhere.
  const top = Math.max(1e-9, ...data.results.flatMap((r) => matchedWords(r).map((m) => m.contribution)));
  grid.replaceChildren(...data.results.map((r) => card(r, top, library)));
  grid.dataset.state = "done";
}

// Words as a person reads them: inflections collapsed (dog, dogs: one word, named by its
// strongest form here), each standing for its vocabulary terms. An answer without them (an
// older server) shows its raw terms, each a word of its own.
function shownWords(data) {
  if (data.query_words && (data.query_words.length || !data.query_terms.length)) return data.query_words;
  return data.query_terms.map((t) => ({ word: t.term, weight: t.weight, own: t.own, terms: [t.term] }));
}

function matchedWords(r) {
  if (r.words && (r.words.length || !r.matched.length)) return r.words;
  return r.matched.map((m) => ({ word: m.term, contribution: m.contribution, terms: [m.term] }));
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
    ...shown.map((w) => queryWord(w, top, editable)),
    ...excluded.map((term) => el("span", { class: "qword", dataset: { term } },
      el("span", { class: "chip q excluded", title: `${term}: removed, and pictures carrying it left out` }, term),
      editable ? editButton(term, "restore", "↺", `put ${term} back`) : null)),
  );
  fitQueryTerms();
}

const EDITABLE_TERM = /^[\p{L}\p{N}]+$/u; // whole words: not word pieces (##s) or punctuation

const forms = (w) => (w.terms.length > 1 ? ` (${w.terms.join(", ")})` : "");

// A word's edits apply to every form it stands for: removing "dogs" removes "dog" too.
function queryWord(w, top, editable) {
  const chip = el("span", {
    class: `chip q${w.own ? " own" : ""}`,
    title: `${w.word}${forms(w)}: weight ${fmt(w.weight)}${w.own ? " (typed)" : " (expansion)"}`,
    style: { "--w": (w.weight / top).toFixed(3) }, dataset: { terms: w.terms.join(" ") },
  }, w.word);
  const terms = w.terms.filter((t) => EDITABLE_TERM.test(t));
  if (!editable || !terms.length) return chip;
  return el("span", { class: "qword", dataset: { term: w.word } }, chip,
    editButton(terms, 2, "+", `weigh ${w.word} up`),
    editButton(terms, 0.5, "−", `weigh ${w.word} down`),
    editButton(terms, "remove", "×", `remove ${w.word} and the pictures carrying it`));
}

function editButton(terms, action, text, label) {
  return el("button", {
    type: "button", class: "act", "aria-label": label, title: label, dataset: { act: String(action) },
    onclick: () => {
      $("#q").value = [].concat(terms).reduce((query, term) => editedQuery(query, term, action), $("#q").value);
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

// In the library a card shows the day its picture was taken where a search shows the score.
function card(r, top, library = false) {
  const open = () => openDetail(r.id);
  return el("article", { class: "card", dataset: { id: r.id, rank: r.rank } },
    el("button", { class: "thumb", type: "button", onclick: open, title: `Open ${r.name}` },
      el("img", { src: r.thumbnail, alt: r.name, loading: "lazy", onerror: (e) => e.target.classList.add("broken") })),
    el("div", { class: "meta" },
      el("span", { class: "rank" }, `#${r.rank}`),
      library
        ? el("time", { class: "taken", datetime: r.taken || undefined, title: r.taken ? `taken ${when(r.taken)}` : "no date" },
          r.taken ? r.taken.slice(0, 10) : "undated")
        : el("span", { class: "score", title: partsTitle(r) }, fmt(r.score)),
      el("span", { class: "name", title: r.path }, r.name)),
    el("div", { class: "chips" }, matchedWords(r).map((m) => chip(m, top))),
  );
}

function chip(m, top) {
  const w = Math.max(0, m.contribution / top);
  return el("span", {
    class: "chip", title: `${m.word}${forms(m)}: adds ${fmt(m.contribution)}`,
    style: { "--w": w.toFixed(3), "font-size": `${(0.72 + 0.36 * w).toFixed(3)}rem` },
  }, m.word);
}

const when = (iso) => iso.replace("T", " ").replace(/(\.\d+)?Z$/, " UTC");

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
  $("#d-caption").textContent = [
    doc.taken ? `taken ${when(doc.taken)}` : null, doc.camera, `${doc.width} × ${doc.height} px`, bytes(doc.size_bytes),
    doc.ingested_at ? `indexed ${when(doc.ingested_at)}` : null,
    ...Object.entries(doc.fields || {}).map(([name, value]) => `${name}: ${value}`),
  ].filter(Boolean).join(" · ");
  $("#d-more").onclick = () => { dialog.close(); searchSimilar(doc.id, doc.name); };
  dialog.dataset.id = doc.id;

  const weights = new Map(doc.terms.map((t) => [t.term, t.weight]));
  const queryWeights = new Map(state.queryTerms.map((t) => [t.term, t.weight]));
  $("#d-query").hidden = !state.queryWords.length;
  $("#d-query-terms").replaceChildren(...state.queryWords.slice(0, QUERY_TERMS_SHOWN).map((w) => {
    // what the word's forms add to this picture's score (the query's raw weights x the picture's)
    const adds = w.terms.reduce((sum, t) => sum + (weights.get(t) || 0) * (queryWeights.get(t) || 0), 0);
    const carried = w.terms.some((t) => weights.has(t));
    return el("span", {
      class: `chip q${carried ? " hit" : ""}`, dataset: { terms: w.terms.join(" ") },
      title: carried ? `${w.word}${forms(w)}: in the picture, adds ${fmt(adds)}` : `${w.word}: not in the picture`,
    }, w.word);
  }));
  // A picture's words by what they say about it: weight x IDF (by weight where the index has no
  // document frequencies); the bar is that value, the weight and IDF are in the title.
  const words = doc.words && doc.words.length ? doc.words
    : doc.terms.map((t) => ({ word: t.term, weight: t.weight, idf: null, terms: [t.term] }));
  $("#d-count").textContent = `(${words.length})`;
  $("#d-count").title = `${doc.term_count} terms, forms of one word counted once`;
  const says = (w) => w.weight; // words by weight: the truest first (docs/design-decisions.md)
  const top = Math.max(1e-9, ...words.slice(0, 1).map(says));
  const bars = (n) => $("#d-bars").replaceChildren(...words.slice(0, n).map((w) => el("div", {
    class: `bar-row${w.terms.some((t) => queryWeights.has(t)) ? " in-query" : ""}`,
    title: `${w.word}${forms(w)}: weight ${fmt(w.weight, 4)}${w.idf === null ? "" : ` × IDF ${fmt(w.idf, 2)}`}`,
    dataset: { terms: w.terms.join(" ") },
  }, el("span", { class: "term" }, w.word),
     el("span", { class: "bar" }, el("span", { style: { width: `${(100 * Math.max(0, says(w)) / top).toFixed(1)}%` } })),
     el("span", { class: "value" }, fmt(says(w))))));
  bars(BARS_SHOWN);
  const more = $("#d-all");
  more.hidden = words.length <= BARS_SHOWN;
  more.textContent = words.length > BARS_MAX ? `Show the top ${BARS_MAX} words` : `Show all ${words.length} words`;
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
  state.canFilter = Boolean(s.filters);
  $("#filterbar").hidden = !state.canFilter;
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

async function start() {
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
  $("#f-from").addEventListener("change", (e) => { state.filters.after = e.target.value || null; applyFilters(); });
  $("#f-to").addEventListener("change", (e) => {
    state.filters.before = e.target.value ? shiftDay(e.target.value, 1) : null;
    applyFilters();
  });
  $("#f-near").addEventListener("change", (e) => { state.filters.near = e.target.value.trim() || null; applyFilters(); });
  $("#f-library").addEventListener("click", () => showLibrary(true));
  $("#more").addEventListener("click", moreOfTheLibrary);
  $("#filters").open = window.matchMedia("(min-width: 641px)").matches; // a phone: the pictures first
  setUpDrop();
  state.status = loadStatus().catch((err) => {
    showMessage(`The index cannot be read: ${err.message}`, "error");
    return null;
  });

  // Ready once the first view (the address's search, or the library) is on screen.
  await restore(new URLSearchParams(location.search), history.state);
  document.body.dataset.ready = "true";
}

// The search an address (and its history entry) stands for, run again without a new entry;
// an address without a query stands for the library (with its filters).
async function restore(params, entry) {
  setOptions(params);
  state.filters = readFilters(params);
  renderActiveFilters();
  loadFacets();
  for (const dialog of document.querySelectorAll("dialog[open]")) dialog.close();
  if (params.get("q") !== null) {
    $("#q").value = params.get("q");
    return searchText(null, false);
  } else if (params.get("like")) {
    return searchSimilar(params.get("like"), "this picture", false);
  } else if (entry && state.pictures[entry.picture]) {
    return searchPicture(state.pictures[entry.picture], false);
  }
  const actions = state.actions;
  const status = await state.status;
  if (state.actions !== actions) return; // the user searched meanwhile
  if (status && status.filters) return showLibrary(false);
  if (state.last || state.searches) {
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

// What is on screen, again (a new mode or new filters); the library only when the filters changed.
function rerun(filtersChanged = false) {
  const last = state.last;
  if ($("#q").value.trim()) searchText();
  else if (last && last.query.kind === "document") searchSimilar(last.query.id, last.query.filename || "this picture");
  else if (last && last.query.kind === "image" && state.picture) searchPicture(state.picture);
  else if (filtersChanged && state.canFilter) showLibrary(true);
}

document.addEventListener("DOMContentLoaded", start);
