// The job list: every column of the fleet at a glance, filtered and sorted in the page, drawn as a
// virtual table (only the rows on screen exist), kept live by the stream. Each row element belongs to one
// job for as long as it is on screen (keyed by the job, never by position): a live update sets only its
// changed texts, and a bar grows from its own job's value, never from the value of the row that was there.
// The order is stable: ties on the sort key are broken by (namespace, name, attempt), and the default sort
// (newest first) is a key that live updates do not change, so rows move only when a user sorts.

import { h, replace, setAttr, setText, svg } from "./dom.js";
import {
  DASH, ENDED, HEALTH_SEVERITY, HEALTH_STATES, JOB_STATES, fmtDateTime, fmtDuration, fmtFinish, fmtMoney, fmtNum,
  fmtOf, fmtPercent, fmtProgress, healthLabel, lossFigure, num, shownPercent, stateClass,
} from "./format.js";
import { dropPendingSparks, loadJobs, state, subscribe, wantSpark } from "./state.js";

const OVERSCAN = 8;
const THROTTLE_MS = 250;

/** Where the user left the list: kept while they look at other views. */
const ui = {
  text: "",
  namespace: "",
  state: "",
  health: "",
  sort: "age", // newest first: a key that live updates never change (see the file's comment)
  descending: false,
  scrollTop: 0,
  selected: new Set(),
};

const now = () => Date.now() / 1000;

/** The height of a row: the stylesheet's --row-h (taller on a narrow screen, where cells hold two lines). */
function rowHeight() {
  return parseFloat(getComputedStyle(document.documentElement).getPropertyValue("--row-h")) || 40;
}

/** Start the list on a filter (the admin view links to a namespace). */
export function presetFilter({ namespace }) {
  ui.namespace = namespace || "";
  ui.scrollTop = 0;
}

export function remaining(job, t = now()) {
  const rs = job.eta && job.eta.remaining_seconds;
  if (rs === null || rs === undefined) return null;
  return Math.max(0, rs - Math.max(0, t - job._at));
}

function lossOf(job) {
  return num(lossFigure(job).value);
}

// the columns: id, header, how to sort (null last whatever the direction), the server's sort key
const COLUMNS = [
  { id: "name", label: "Name", sub: "namespace", key: (j) => j.name, server: "name" },
  { id: "namespace", label: "Namespace", key: (j) => j.namespace, server: "namespace" },
  { id: "state", label: "State", sub: "health", key: (j) => JOB_STATES.indexOf(j.state), server: "state" },
  { id: "health", label: "Health", key: (j) => HEALTH_SEVERITY[j.health.state] ?? 9 },
  { id: "progress", label: "Progress", sub: "step", key: (j) => j.progress.percent, server: "progress" },
  { id: "step", label: "Step", key: (j) => j.progress.step, server: "step" },
  { id: "epoch", label: "Epoch", key: (j) => j.progress.epoch },
  { id: "eta", label: "ETA", wide: " / finish", key: (j) => remaining(j), server: "eta" },
  { id: "loss", label: "Loss", key: (j) => { const v = lossOf(j); return v === null || Number.isNaN(v) ? null : v; } },
  { id: "cost", label: "Cost", key: (j) => j.cost.spent },
  // youngest first when ascending: the server's "created" runs the other way (invert)
  { id: "age", label: "Age", key: (j) => -j.times.created, server: "created", invert: true },
];
const UPDATED = { id: "updated", key: (j) => j.times.updated, server: "updated" };

function column(id) {
  return COLUMNS.find((c) => c.id === id) || UPDATED;
}

function matches(job) {
  if (ui.namespace && job.namespace !== ui.namespace) return false;
  if (ui.state && job.state !== ui.state) return false;
  if (ui.health && job.health.state !== ui.health) return false;
  if (ui.text) {
    const t = ui.text.toLowerCase();
    if (!job.name.includes(t) && !job.namespace.includes(t)) return false;
  }
  return true;
}

/** The fixed order of two jobs that tie on the sort key: namespace, then name, then attempt. */
export function tieBreak(a, b) {
  if (a.namespace !== b.namespace) return a.namespace < b.namespace ? -1 : 1;
  if (a.name !== b.name) return a.name < b.name ? -1 : 1;
  return (a.attempt ?? 0) - (b.attempt ?? 0);
}

/** Sort [key value, job key, job] rows: by value in the direction asked, unknown values last whatever the
    direction, ties in the fixed order of tieBreak (never by arrival or position: those change live). */
export function sortRows(rows, descending) {
  const dir = descending ? -1 : 1;
  const missing = (v) => v === null || v === undefined || Number.isNaN(v);
  rows.sort((a, b) => {
    const x = a[0];
    const y = b[0];
    if (missing(x) || missing(y)) {
      if (!missing(x)) return -1;
      if (!missing(y)) return 1;
    } else if (x < y) return -dir;
    else if (x > y) return dir;
    return tieBreak(a[2], b[2]);
  });
  return rows;
}

function ordered() {
  const col = column(ui.sort);
  const rows = [];
  for (const [key, job] of state.jobs) if (matches(job)) rows.push([col.key(job), key, job]);
  return sortRows(rows, ui.descending).map((r) => r[1]);
}

export function renderJobs(main) {
  let order = [];
  const rows = new Map(); // job key -> its row element, for the jobs on screen (a row never changes job)
  let lastRender = 0;
  let timer = null;
  let needOrder = true;
  let destroyed = false;

  const count = h("span", { class: "count", role: "status", "aria-live": "polite", "data-testid": "count" });
  const notice = h("p", { class: "notice", hidden: true });
  const compareButton = h("button", { type: "button", class: "primary", onclick: () => {
    location.hash = `#/compare/${[...ui.selected].join(",")}`;
  } });
  const textInput = h("input", { id: "f-text", type: "search", placeholder: "name or namespace", value: ui.text, autocomplete: "off" });
  const nsSelect = h("select", { id: "f-namespace" });
  const stateSelect = h("select", { id: "f-state" }, h("option", { value: "" }, "any"),
    JOB_STATES.map((s) => h("option", { value: s, selected: ui.state === s }, s)));
  const healthSelect = h("select", { id: "f-health" }, h("option", { value: "" }, "any"),
    HEALTH_STATES.map((s) => h("option", { value: s, selected: ui.health === s }, healthLabel(s))));

  const filters = h("form", { class: "filters", role: "search", "aria-label": "Filter jobs", onsubmit: (e) => e.preventDefault() },
    h("label", { for: "f-text" }, "Search"), textInput,
    h("label", { for: "f-namespace" }, "Namespace"), nsSelect,
    h("label", { for: "f-state" }, "State"), stateSelect,
    h("label", { for: "f-health" }, "Health"), healthSelect,
    h("button", { type: "button", onclick: clearFilters }, "Clear"),
    count, compareButton);

  const headerCells = [h("th", { scope: "col", class: "c-select" }, h("span", { class: "sr" }, "Select"))];
  const sortButtons = new Map();
  for (const col of COLUMNS) {
    const button = h("button", { type: "button", class: "sort", onclick: () => sortBy(col.id) }, col.label,
      col.wide ? h("span", { class: "wide" }, col.wide) : null);
    sortButtons.set(col.id, button);
    // on a narrow screen a column also shows the one it took in (the namespace under the name...)
    headerCells.push(h("th", { scope: "col", class: `c-${col.id}` }, button, col.sub ? h("span", { class: "sub" }, ` / ${col.sub}`) : null));
  }
  // one cell without a colspan: a spacer spanning every column would keep the columns a narrow screen hides
  // (display: none) in the table's grid, sharing out the width the name should get
  const topSpacer = h("tr", { class: "spacer", "aria-hidden": "true" }, h("td"));
  const bottomSpacer = h("tr", { class: "spacer", "aria-hidden": "true" }, h("td"));
  const tbody = h("tbody", null, topSpacer, bottomSpacer);
  const table = h("table", { class: "jobs", "aria-label": "Jobs", "data-testid": "jobs" },
    h("thead", null, h("tr", null, headerCells)), tbody);
  const empty = h("p", { class: "empty", hidden: true });
  const wrap = h("div", { class: "table-wrap", onscroll: () => { ui.scrollTop = wrap.scrollTop; schedule(false, true); } }, table, empty);

  main.replaceChildren(h("h1", { class: "sr" }, "Jobs"), filters, notice, wrap);

  textInput.addEventListener("input", () => { ui.text = textInput.value.trim(); filterChanged(); });
  nsSelect.addEventListener("change", () => { ui.namespace = nsSelect.value; filterChanged(); });
  stateSelect.addEventListener("change", () => { ui.state = stateSelect.value; filterChanged(); });
  healthSelect.addEventListener("change", () => { ui.health = healthSelect.value; filterChanged(); });
  tbody.addEventListener("keydown", onKey);
  tbody.addEventListener("change", (e) => {
    const box = e.target.closest("input[type=checkbox]");
    if (!box) return;
    const key = box.closest("tr").dataset.key;
    if (box.checked) ui.selected.add(key);
    else ui.selected.delete(key);
    updateCompare();
  });
  const resize = () => schedule(false, true);
  window.addEventListener("resize", resize);

  const unsubscribe = subscribe((kind, detail) => {
    if (kind === "jobs") {
      fillNamespaces();
      schedule(true, true); // a new list: drawn at once (only live updates are throttled)
    } else if (kind === "job") {
      if (detail.isNew) fillNamespaces();
      schedule(true);
    }
  });
  const clockTimer = setInterval(() => schedule(ui.sort === "eta" || ui.sort === "cost"), 1000);

  let serverTimer = null;
  function filterChanged() {
    wrap.scrollTop = 0;
    if (!state.complete) {
      // the fleet is larger than one read: the server filters, the page keeps filtering what streams in
      clearTimeout(serverTimer);
      serverTimer = setTimeout(() => loadJobs(serverParams()).catch(() => {}), 300);
    }
    schedule(true, true);
  }

  function serverParams() {
    const p = {};
    if (ui.namespace) p.namespace = ui.namespace;
    if (ui.state) p.state = ui.state;
    if (ui.health) p.health = ui.health;
    if (ui.text) p.text = ui.text;
    const col = column(ui.sort);
    if (col.server) p.sort = `${ui.descending !== Boolean(col.invert) ? "-" : ""}${col.server}`;
    return p;
  }

  function clearFilters() {
    ui.text = ""; ui.namespace = ""; ui.state = ""; ui.health = "";
    textInput.value = ""; nsSelect.value = ""; stateSelect.value = ""; healthSelect.value = "";
    filterChanged();
  }

  function sortBy(id) {
    if (ui.sort === id) ui.descending = !ui.descending;
    else {
      ui.sort = id;
      ui.descending = ["progress", "step", "epoch", "cost"].includes(id);
    }
    if (!state.complete && column(id).server) loadJobs(serverParams()).catch(() => {});
    schedule(true, true);
  }

  function fillNamespaces() {
    const names = new Set();
    for (const job of state.jobs.values()) names.add(job.namespace);
    if (ui.namespace) names.add(ui.namespace);
    const sorted = [...names].sort();
    const current = [...nsSelect.options].map((o) => o.value).slice(1);
    if (current.length === sorted.length && current.every((v, i) => v === sorted[i])) {
      nsSelect.value = ui.namespace;
      return;
    }
    replace(nsSelect, h("option", { value: "" }, "any"),
      sorted.map((n) => h("option", { value: n, selected: ui.namespace === n }, n)));
  }

  function schedule(reorder, immediate = false) {
    if (reorder) needOrder = true;
    if (timer !== null && immediate) {
      clearTimeout(timer);
      timer = null;
    }
    if (timer !== null) return;
    const wait = immediate ? 0 : Math.max(0, THROTTLE_MS - (performance.now() - lastRender));
    timer = setTimeout(() => {
      timer = null;
      if (!destroyed) requestAnimationFrame(render);
    }, wait);
  }

  function render() {
    if (destroyed) return;
    lastRender = performance.now();
    if (needOrder) {
      order = ordered();
      needOrder = false;
    }
    const viewport = wrap.clientHeight || 600;
    const rowH = rowHeight();
    const first = Math.max(0, Math.floor(wrap.scrollTop / rowH) - OVERSCAN);
    const last = Math.min(order.length, first + Math.ceil(viewport / rowH) + 2 * OVERSCAN);
    topSpacer.style.height = `${first * rowH}px`;
    bottomSpacer.style.height = `${(order.length - last) * rowH}px`;
    const t = now();
    const visible = new Set(order.slice(first, last));
    for (const [key, tr] of rows) {
      if (!visible.has(key)) {
        tr.remove();
        rows.delete(key);
      }
    }
    let previous = topSpacer;
    for (let i = first; i < last; i++) {
      const key = order[i];
      let tr = rows.get(key);
      if (!tr) {
        // a job new on screen gets a row of its own, filled before it is in the page: its bar starts at its
        // own value (an element reused from another job would slide from that job's value)
        tr = makeRow(key);
        rows.set(key, tr);
      }
      fillRow(tr, state.jobs.get(key), i, t);
      if (previous.nextSibling !== tr) previous.after(tr); // moved only when the order changed
      previous = tr;
    }
    dropPendingSparks(visible);
    for (const key of visible) wantSpark(key, sparkReady);
    setAttr(table, "aria-rowcount", order.length + 1);
    const shown = order.length.toLocaleString("en-US");
    const all = state.total.toLocaleString("en-US");
    setText(count, !state.loaded ? "loading…" : state.partial ? `${shown} of ${all} jobs (loading the rest…)` : `${shown} of ${all} jobs`);
    empty.hidden = !state.loaded || order.length > 0;
    setText(empty, state.jobs.size ? "No job matches these filters." : "No jobs yet. Start one with `stepwatch run -- python train.py`.");
    notice.hidden = state.complete || !state.loaded || state.partial;
    setText(notice, `More than ${state.jobs.size.toLocaleString("en-US")} jobs: filters and the sort by name, namespace, state, progress, step, ETA or age are applied by the server.`);
    for (const [id, button] of sortButtons) {
      const th = button.parentElement;
      if (id === ui.sort) th.setAttribute("aria-sort", ui.descending ? "descending" : "ascending");
      else th.removeAttribute("aria-sort");
    }
    updateCompare();
  }

  function sparkReady(key) {
    const tr = rows.get(key);
    if (tr) drawSpark(tr.cells[9].lastChild, key);
  }

  function updateCompare() {
    setText(compareButton, `Compare selected (${ui.selected.size})`);
    compareButton.disabled = ui.selected.size < 2;
  }

  function onKey(e) {
    if (e.key !== "ArrowDown" && e.key !== "ArrowUp") return;
    const tr = e.target.closest("tr");
    if (!tr || !tr.dataset.index) return;
    e.preventDefault();
    const index = Number(tr.dataset.index) + (e.key === "ArrowDown" ? 1 : -1);
    if (index < 0 || index >= order.length) return;
    const cellIndex = e.target.closest("td").cellIndex;
    const rowH = rowHeight();
    const rowTop = index * rowH;
    if (rowTop < wrap.scrollTop + rowH) wrap.scrollTop = Math.max(0, rowTop - rowH);
    else if (rowTop + rowH > wrap.scrollTop + wrap.clientHeight - rowH) wrap.scrollTop = rowTop + 2 * rowH - wrap.clientHeight;
    render();
    const target = [...rows.values()].find((r) => Number(r.dataset.index) === index);
    const focusable = target && target.cells[cellIndex].querySelector("a, input");
    if (focusable) focusable.focus();
  }

  schedule(true, true);
  fillNamespaces();
  requestAnimationFrame(() => { wrap.scrollTop = ui.scrollTop; });

  return {
    destroy() {
      destroyed = true;
      unsubscribe();
      clearInterval(clockTimer);
      clearTimeout(timer);
      window.removeEventListener("resize", resize);
    },
  };
}

function makeRow(key) {
  const checkbox = h("input", { type: "checkbox" });
  const link = h("a", { class: "job-link" });
  const bar = h("div", { class: "bar", role: "progressbar", "aria-valuemin": "0", "aria-valuemax": "100" }, h("div", { class: "fill" }));
  // .sub: what a narrow screen shows of a hidden column under another one (see app.css)
  return h("tr", { "data-key": key },
    h("td", { class: "c-select" }, checkbox),
    h("td", { class: "c-name" }, link, h("span", { class: "sub" })),
    h("td", { class: "c-namespace" }),
    h("td", { class: "c-state" }, h("span", { class: "badge" }), h("span", { class: "badge sub" })),
    h("td", { class: "c-health" }, h("span", { class: "badge" })),
    h("td", { class: "c-progress" }, h("div", null, bar, h("span", { class: "pct" })), h("span", { class: "sub" })),
    h("td", { class: "c-step num" }),
    h("td", { class: "c-epoch num" }),
    h("td", { class: "c-eta" }, h("span", { class: "eta" }), h("span", { class: "finish" })),
    h("td", { class: "c-loss num" }, h("span", { class: "v" }), h("span", { class: "spark" })),
    h("td", { class: "c-cost num" }),
    h("td", { class: "c-age num" }));
}

function fillRow(tr, job, index, t) {
  const key = tr.dataset.key;
  tr.dataset.index = String(index);
  setAttr(tr, "aria-rowindex", index + 2);
  const c = tr.cells;
  const box = c[0].firstChild;
  box.checked = ui.selected.has(key);
  setAttr(box, "aria-label", `Select ${job.name} for comparison`);
  const link = c[1].firstChild;
  setAttr(link, "href", `#/?job=${encodeURIComponent(key)}`);
  setText(link, job.name);
  setAttr(link, "title", key);
  setText(c[1].lastChild, job.namespace);
  setText(c[2], job.namespace);
  setAttr(c[2], "title", job.namespace);
  const stateBadge = c[3].firstChild;
  setAttr(stateBadge, "class", `badge ${stateClass("s", job.state, JOB_STATES)}`);
  setText(stateBadge, job.state);
  const healthClass = `badge ${stateClass("h", job.health.state, HEALTH_STATES)}`;
  setAttr(c[3].lastChild, "class", `${healthClass} sub`);
  setText(c[3].lastChild, healthLabel(job.health.state));
  // the verdict's message (rank and place in words) is the badge's tooltip: the list has no room for it
  const why = String((job.health.evidence && job.health.evidence.message) || "");
  setAttr(c[3].lastChild, "title", why);
  const healthBadge = c[4].firstChild;
  setAttr(healthBadge, "class", healthClass);
  setText(healthBadge, healthLabel(job.health.state));
  setAttr(healthBadge, "title", why);
  // the bar and the number beside it are one value: the percent as the server sends it (shown by one rule)
  const percent = shownPercent(job.progress.percent);
  const bar = c[5].firstChild.firstChild;
  const width = `${percent ?? 0}%`;
  if (bar.firstChild.style.width !== width) bar.firstChild.style.width = width;
  setAttr(bar, "aria-valuenow", percent ?? 0);
  setAttr(bar, "aria-label", `${job.name} progress`);
  // the cell has room for a percentage only; an early end's "ended at 49.8%" is its tooltip (and the panel's text)
  setText(c[5].firstChild.lastChild, fmtPercent(percent));
  setAttr(c[5].firstChild.lastChild, "title", fmtProgress(job.state, percent));
  const steps = fmtOf(job.progress.step, job.progress.total_steps);
  setText(c[5].lastChild, steps);
  setText(c[6], steps);
  setAttr(c[6], "title", steps);
  const ep = job.progress;
  setText(c[7], ep.epoch === null ? DASH : `${fmtNum(ep.epoch, 3)}${ep.total_epochs ? ` / ${fmtNum(ep.total_epochs, 3)}` : ""}`);
  const rest = remaining(job, t);
  setText(c[8].firstChild, ENDED.has(job.state) ? DASH : fmtDuration(rest));
  const finish = rest === null || ENDED.has(job.state) ? null : t + rest;
  setText(c[8].lastChild, finish === null ? "" : fmtFinish(finish));
  setAttr(c[8], "title", finish === null ? "" : `finishes ${fmtDateTime(finish)}`);
  const { metric, value: loss, last, smoothed } = lossFigure(job);
  const lossCell = c[9].firstChild;
  setText(lossCell, fmtNum(loss));
  setAttr(lossCell, "title", !metric ? "" : smoothed
    ? `${metric}: ${fmtNum(loss, 8)}, the mean of the last window; last batch ${fmtNum(last, 8)}`
    : `${metric}: last batch ${fmtNum(last, 8)}`);
  lossCell.classList.toggle("nonfinite", loss !== null && !Number.isFinite(num(loss)));
  drawSpark(c[9].lastChild, key);
  setText(c[10], fmtMoney(job.cost.spent));
  setText(c[11], fmtDuration(t - job.times.created));
}

function drawSpark(holder, key) {
  const spark = state.sparks.get(key);
  if (!spark || spark.values.length < 2) return;
  const sig = `${spark.values.length}:${spark.values[spark.values.length - 1]}`;
  if (holder.dataset.sig === sig) return;
  holder.dataset.sig = sig;
  const finite = spark.values.filter(Number.isFinite);
  const W = 42; // the cell holds a loss as wide as "-9.48e+34" beside it (app.css, .c-loss)
  const H = 16;
  const lo = Math.min(...finite);
  const hi = Math.max(...finite);
  const n = spark.values.length;
  const pts = [];
  let bad = false;
  spark.values.forEach((v, i) => {
    if (!Number.isFinite(v)) { bad = true; return; }
    const x = (i / (n - 1)) * W;
    const y = hi > lo ? H - 1 - ((v - lo) / (hi - lo)) * (H - 2) : H / 2;
    pts.push(`${x.toFixed(1)},${y.toFixed(1)}`);
  });
  const graphic = svg("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}`, "aria-hidden": "true", class: bad ? "has-nan" : "" });
  graphic.append(svg("polyline", { points: pts.join(" ") }));
  if (bad) graphic.append(svg("circle", { cx: W - 2, cy: 3, r: 2.5, class: "nan" }));
  holder.replaceChildren(graphic);
}
