// Compare runs: overlaid curves per metric on aligned steps, and a table of hyperparameters and final
// and best metrics in which the rows whose values differ are marked. A metric with one value per run
// (Hugging Face's total_flos, train_runtime) is a table row, not a one-point chart; a run whose values
// blew up does not flatten the others (see chooseScale); a run that went NaN/Inf gets no ★.

import { getJSON, historyPath, jobPath } from "./api.js";
import { PALETTE, chartLayout, chooseScale, columns, draw, leaveMarkers, legendRows, loadPlotly, seriesTraces } from "./charts.js";
import { h, replace } from "./dom.js";
import { DASH, betterDirection, fmtMoney, fmtNum, fmtOf, fmtPercent, healthLabel, metricOrder, num } from "./format.js";
import { state, subscribe } from "./state.js";

const MAX_POINTS = 500;
const prefs = { log: false, smoothing: 0 };

export function renderCompare(main, keys) {
  const runs = new Map(); // key -> {view, series}
  const charts = new Map(); // metric -> {div, note}
  let destroyed = false;
  let timer = null;

  const go = (list) => { location.hash = `#/compare/${list.join(",")}`; };
  const status = h("p", { class: "message", role: "status", "aria-live": "polite" });
  const chips = h("ul", { class: "chips", "aria-label": "Runs compared" },
    keys.map((key, i) => h("li", null,
      h("span", { class: "swatch", style: { background: PALETTE[i % PALETTE.length] }, "aria-hidden": "true" }),
      h("a", { href: `#/compare/${keys.join(",")}?job=${encodeURIComponent(key)}` }, key),
      h("button", { type: "button", "aria-label": `Remove ${key} from the comparison`, onclick: () => go(keys.filter((k) => k !== key)) }, "×"))));
  const addInput = h("input", { id: "c-add", list: "c-jobs", placeholder: "namespace/name", autocomplete: "off" });
  const datalist = h("datalist", { id: "c-jobs" });
  const fillOptions = () => {
    const typed = addInput.value.trim();
    const options = [];
    for (const key of state.jobs.keys()) {
      if (keys.includes(key) || (typed && !key.includes(typed))) continue;
      options.push(h("option", { value: key }));
      if (options.length >= 200) break;
    }
    datalist.replaceChildren(...options);
  };
  addInput.addEventListener("input", fillOptions);
  const addForm = h("form", { class: "filters", onsubmit: (e) => {
    e.preventDefault();
    const key = addInput.value.trim();
    if (!/^[a-z0-9-]+\/[a-z0-9-]+$/.test(key)) {
      status.textContent = "Give a job as namespace/name.";
      return;
    }
    if (!keys.includes(key)) go([...keys, key]);
  } }, h("label", { for: "c-add" }, "Add a run"), addInput, datalist, h("button", { type: "submit" }, "Add"));

  const log = h("input", { type: "checkbox", id: "c-log", checked: prefs.log });
  const smoothing = h("input", { type: "range", id: "c-smooth", min: "0", max: "0.99", step: "0.01", value: String(prefs.smoothing) });
  const smoothOut = h("output", { for: "c-smooth" }, String(prefs.smoothing));
  const changed = () => {
    prefs.log = log.checked;
    prefs.smoothing = Number(smoothing.value);
    smoothOut.textContent = smoothing.value;
    drawAll();
  };
  log.addEventListener("input", changed);
  smoothing.addEventListener("input", changed);
  const grid = h("div", { class: "charts wide", "data-testid": "compare-charts" });
  const singles = h("p", { class: "muted", "data-testid": "single-values", hidden: true });
  const tableHolder = h("div", { class: "table-scroll", "data-testid": "compare-table" });

  replace(main,
    h("h1", null, "Compare runs"),
    keys.length < 2 ? h("p", { class: "muted" }, "Pick two or more runs: tick them in the job list, or add them here.") : null,
    chips, addForm, status,
    h("div", { class: "chart-controls" },
      h("span", null, log, h("label", { for: "c-log" }, "log scale")),
      h("span", null, h("label", { for: "c-smooth" }, "smoothing"), smoothing, smoothOut)),
    h("h2", null, "Curves on aligned steps"), grid, singles,
    h("h2", null, "Hyperparameters and results"),
    h("p", { class: "muted" }, "Rows marked ≠ differ between the runs; ★ marks the best run of a metric row (lower is better for losses and errors, higher for accuracy-like metrics); a run whose metric went NaN or Inf gets no ★ for it."),
    tableHolder);

  async function load() {
    status.textContent = keys.length ? "Loading…" : "";
    const results = await Promise.allSettled(keys.map(async (key) => {
      const [namespace, name] = [key.slice(0, key.indexOf("/")), key.slice(key.indexOf("/") + 1)];
      const view = await getJSON(jobPath(namespace, name));
      const names = view.metric_names || [];
      const history = await getJSON(historyPath(namespace, name, names.some((n) => n.includes(",")) ? [] : names, MAX_POINTS));
      return [key, { view, series: history.metrics }];
    }));
    if (destroyed) return;
    const problems = [];
    results.forEach((r, i) => {
      if (r.status === "fulfilled") runs.set(r.value[0], r.value[1]);
      else problems.push(`${keys[i]}: ${r.reason.message}`);
    });
    status.textContent = problems.join("; ");
    buildCharts();
    renderTable();
  }

  function metricNames() {
    const names = new Set();
    for (const run of runs.values()) for (const n of Object.keys(run.series)) names.add(n);
    return metricOrder([...names]);
  }

  /** A metric with at most one point in every run: a figure, not a curve. */
  function singleValued(name) {
    return [...runs.values()].every((run) => !run.series[name] || run.series[name].length <= 1);
  }

  function buildCharts() {
    grid.replaceChildren();
    for (const chart of charts.values()) if (window.Plotly) window.Plotly.purge(chart.div);
    charts.clear();
    const all = metricNames();
    const names = all.filter((n) => !singleValued(n));
    const once = all.filter(singleValued);
    singles.hidden = !once.length;
    singles.textContent = once.length ? `One value per run, in the table below (no curve to draw): ${once.join(", ")}.` : "";
    if (!names.length) {
      grid.append(h("p", { class: "muted" }, runs.size && !once.length ? "No metrics reported yet." : ""));
      return;
    }
    for (const name of names) {
      const div = h("div", { class: "chart", role: "img", "aria-label": `${name} of ${[...runs.keys()].join(", ")}`, dataset: { metric: name } });
      const note = h("p", { class: "chart-note", hidden: true });
      grid.append(h("div", { class: "chart-box" }, div, note));
      charts.set(name, { div, note });
    }
    loadPlotly().then(drawAll).catch((err) => replace(grid, h("p", { class: "bad" }, `Charts are unavailable: ${err.message}`)));
  }

  function drawAll() {
    for (const [name, { div, note }] of charts) {
      const traces = [];
      const series = [];
      const shown = [];
      keys.forEach((key, i) => {
        const run = runs.get(key);
        if (!run || !run.series[name]) return;
        const color = PALETTE[i % PALETTE.length];
        traces.push(...seriesTraces(run.series[name], { name: key, color, smoothing: prefs.smoothing }));
        const c = columns(run.series[name]);
        series.push({ name: key, color, x: c.steps, values: c.values });
        shown.push(key);
      });
      div.dataset.traces = String(traces.filter((t) => t.yaxis !== "y2" && !(prefs.smoothing && t.opacity < 1)).length);
      // the range of the sane runs (a diverged one never flattens the rest), marked where a run leaves it
      const scale = chooseScale(series.map((r) => r.values), prefs.log);
      traces.push(...leaveMarkers(series, scale));
      note.hidden = !scale.note;
      note.textContent = scale.note || "";
      const layout = chartLayout({ title: name, log: scale.log, range: scale.range, legend: true, legendRows: legendRows(shown, div.clientWidth), height: 260 });
      draw(div, traces, layout).catch(() => {});
    }
  }

  function renderTable() {
    const cols = keys.filter((k) => runs.has(k));
    if (!cols.length) {
      tableHolder.replaceChildren();
      return;
    }
    const rows = [];
    const section = (title) => rows.push(h("tr", { class: "section" }, h("th", { colspan: cols.length + 2, scope: "colgroup" }, title)));
    const row = (label, cells, best = null) => {
      const texts = cells.map((c) => c.text);
      const differs = new Set(texts).size > 1;
      rows.push(h("tr", { class: differs ? "differs" : "" },
        h("td", { class: "mark" }, differs ? h("span", { title: "differs" }, "≠", h("span", { class: "sr" }, " differs")) : ""),
        h("th", { scope: "row" }, label),
        cells.map((c, i) => h("td", { class: i === best ? "best" : "" }, c.text,
          i === best ? h("span", { class: "star", title: "best of these runs" }, " ★", h("span", { class: "sr" }, " best")) : null))));
    };
    const views = cols.map((k) => runs.get(k).view);
    section("Run");
    row("state", views.map((v) => ({ text: v.state })));
    row("health", views.map((v) => ({ text: healthLabel(v.health.state) })));
    row("progress", views.map((v) => ({ text: fmtPercent(v.progress.percent) })));
    row("step", views.map((v) => ({ text: fmtOf(v.progress.step, v.progress.total_steps) })));
    row("cost spent", views.map((v) => ({ text: fmtMoney(v.cost.spent) })));
    const paramKeys = [...new Set(views.flatMap((v) => Object.keys(v.params || {})))].sort();
    section("Hyperparameters");
    if (!paramKeys.length) rows.push(h("tr", null, h("td"), h("td", { colspan: cols.length + 1, class: "muted" }, "None reported.")));
    for (const p of paramKeys) {
      row(p, views.map((v) => {
        const value = (v.params || {})[p];
        return { text: value === undefined ? DASH : typeof value === "object" ? JSON.stringify(value) : String(value) };
      }));
    }
    const names = metricNames();
    section("Final metrics (last value)");
    for (const m of names) {
      const values = cols.map((k) => finalValue(runs.get(k), m));
      const blown = cols.map((k) => wentNonFinite(runs.get(k), m));
      row(m, values.map((v) => ({ text: fmtNum(v, 5) })), pickBest(values.map((v, i) => (blown[i] ? null : v)), betterDirection(m)));
    }
    const directed = names.filter((m) => betterDirection(m) !== 0);
    if (directed.length) {
      section("Best metrics (over the whole run)");
      for (const m of directed) {
        const dir = betterDirection(m);
        const values = cols.map((k) => bestValue(runs.get(k), m, dir));
        // a run that went NaN/Inf has no best to stand on (its "min 0" is the blow-up, not learning)
        const blown = cols.map((k) => wentNonFinite(runs.get(k), m));
        row(`${m} (${dir < 0 ? "min" : "max"})`, values.map((v, i) => ({ text: `${fmtNum(v, 5)}${blown[i] ? " (went NaN/Inf)" : ""}` })),
          pickBest(values.map((v, i) => (blown[i] ? null : v)), dir));
      }
    }
    tableHolder.replaceChildren(h("table", { class: "compare" },
      h("thead", null, h("tr", null, h("td"), h("th", { scope: "col" }, ""), cols.map((k, i) => h("th", { scope: "col" },
        h("span", { class: "swatch", style: { background: PALETTE[keys.indexOf(k) % PALETTE.length] }, "aria-hidden": "true" }), k)))),
      h("tbody", null, rows)));
  }

  const unsubscribe = subscribe((kind, detail) => {
    if (kind !== "points" || !runs.has(detail.key)) return;
    const run = runs.get(detail.key);
    let added = false;
    for (const [name, point] of Object.entries(detail.points)) {
      if (!run.series[name]) {
        run.series[name] = [];
        added = true;
      }
      run.series[name].push(point);
    }
    if (timer) return;
    timer = setTimeout(() => {
      timer = null;
      if (destroyed) return;
      if (added) buildCharts();
      else drawAll();
      renderTable();
    }, 500);
  });

  load();
  return {
    destroy() {
      destroyed = true;
      unsubscribe();
      clearTimeout(timer);
      if (window.Plotly) for (const { div } of charts.values()) window.Plotly.purge(div);
    },
  };
}

function finalValue(run, metric) {
  const series = run.series[metric];
  if (series && series.length) return num(series[series.length - 1].last);
  const v = run.view.metrics ? run.view.metrics[metric] : undefined;
  return v === undefined ? null : num(v);
}

/** Whether a run's metric held a NaN or an infinity at some point (then diverged). */
function wentNonFinite(run, metric) {
  const series = run.series[metric] || [];
  if (series.some((p) => p.nonfinite > 0 || (num(p.last) !== null && !Number.isFinite(num(p.last))))) return true;
  const v = run.view.metrics ? num(run.view.metrics[metric]) : null;
  return v !== null && !Number.isFinite(v);
}

function bestValue(run, metric, dir) {
  const series = run.series[metric] || [];
  let best = null;
  for (const p of series) {
    const v = dir < 0 ? p.min : p.max;
    if (v === null || v === undefined || !Number.isFinite(v)) continue;
    if (best === null || (dir < 0 ? v < best : v > best)) best = v;
  }
  return best;
}

function pickBest(values, dir) {
  if (!dir) return null;
  let best = null;
  values.forEach((v, i) => {
    if (v === null || !Number.isFinite(v)) return;
    if (best === null || (dir < 0 ? v < values[best] : v > values[best])) best = i;
  });
  // a best only when one run is strictly better than every other
  const ties = values.filter((v) => v !== null && Number.isFinite(v) && v === values[best]).length;
  const finite = values.filter((v) => v !== null && Number.isFinite(v));
  return finite.length > 1 && ties === 1 ? best : null;
}
