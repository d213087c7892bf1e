// Charts of metric series with plotly.js (served from the installed plotly package, loaded on first use).
// Every string that plotly shows goes through escapeMarkup: plotly reads a few HTML-like tags in texts.

import { escapeMarkup } from "./dom.js";
import { fmtNum, num } from "./format.js";
import { pointValue } from "./state.js";

let loading = null;

/** plotly.js, loaded once, when the first chart is about to be drawn. */
export function loadPlotly() {
  if (window.Plotly) return Promise.resolve(window.Plotly);
  if (!loading) {
    loading = new Promise((resolve, reject) => {
      const script = document.createElement("script");
      script.src = "/ui/vendor/plotly.min.js";
      script.onload = () => (window.Plotly ? resolve(window.Plotly) : reject(new Error(window.STEPWATCH_NO_CHARTS || "plotly.js did not load")));
      script.onerror = () => {
        loading = null;
        reject(new Error("plotly.js could not be loaded from the server"));
      };
      document.head.append(script);
    });
  }
  return loading;
}

/** Colour-blind-safe (Okabe-Ito), distinct in light and dark. */
export const PALETTE = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#999999"];

function css(name, fallback) {
  const v = getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  return v || fallback;
}

/** Exponential moving average, debiased like TensorBoard's; gaps (NaN, null) are skipped, not spread. */
export function smooth(values, weight) {
  if (!weight) return values;
  let last = 0;
  let n = 0;
  return values.map((v) => {
    if (v === null || !Number.isFinite(v)) return null;
    last = last * weight + (1 - weight) * v;
    n += 1;
    // 12 digits: the debiasing's rounding noise would make a constant series (a fixed learning rate) zigzag
    return Number((last / (1 - weight ** n)).toPrecision(12));
  });
}

/** Convert points (of a history read or the live stream: the same shape) to plottable columns. */
export function columns(points) {
  const steps = [];
  const times = [];
  const values = [];
  const mins = [];
  const maxs = [];
  const bad = [];
  for (const p of points) {
    steps.push(p.step);
    times.push(new Date(p.t * 1000));
    const v = pointValue(p);
    values.push(v === null || !Number.isFinite(v) ? null : v);
    mins.push(p.min ?? null);
    maxs.push(p.max ?? null);
    const last = num(p.last);
    bad.push(p.nonfinite > 0 || (last !== null && !Number.isFinite(last)) ? p.nonfinite || 1 : 0);
  }
  return { steps, times, values, mins, maxs, bad };
}

/**
 * The traces of one series: the min-max band (optional), the raw line (faint when smoothed), the
 * smoothed line, and a marker at the top of the chart for every window that held NaN or Inf.
 */
export function seriesTraces(points, { name, color = PALETTE[0], xAxis = "step", smoothing = 0, band = false, nanMarkers = true }) {
  const c = columns(points);
  const x = xAxis === "time" ? c.times : c.steps;
  const label = escapeMarkup(name);
  const traces = [];
  if (band) {
    // windows with no finite value have no band: leave them out (a gap in a filled band draws wrong)
    const keep = c.mins.map((v, i) => v !== null && c.maxs[i] !== null);
    const bx = x.filter((_, i) => keep[i]);
    traces.push({ x: bx, y: c.mins.filter((_, i) => keep[i]), type: "scatter", mode: "lines", line: { width: 0 }, hoverinfo: "skip", showlegend: false, name: `${label} min` });
    traces.push({ x: bx, y: c.maxs.filter((_, i) => keep[i]), type: "scatter", mode: "lines", line: { width: 0 }, fill: "tonexty", fillcolor: `${color}33`, hoverinfo: "skip", showlegend: false, name: `${label} max` });
  }
  traces.push({
    x, y: c.values, type: "scatter", mode: points.length < 3 ? "lines+markers" : "lines", name: label,
    line: { color, width: smoothing ? 1 : 1.6 }, opacity: smoothing ? 0.3 : 1,
    hovertemplate: `%{y:.6g}<extra>${label}${smoothing ? " (raw)" : ""}</extra>`,
    showlegend: !smoothing,
  });
  if (smoothing) {
    traces.push({
      x, y: smooth(c.values, smoothing), type: "scatter", mode: "lines", name: label, line: { color, width: 1.8 },
      hovertemplate: `%{y:.6g}<extra>${label} (smoothed)</extra>`,
    });
  }
  if (nanMarkers) {
    const nx = [];
    const text = [];
    c.bad.forEach((count, i) => {
      if (count) {
        nx.push(x[i]);
        text.push(`${count} NaN/Inf value${count === 1 ? "" : "s"} at step ${c.steps[i]}`);
      }
    });
    if (nx.length) {
      traces.push({
        x: nx, y: nx.map(() => 0.96), yaxis: "y2", type: "scatter", mode: "markers", name: `${label} NaN/Inf`,
        marker: { symbol: "x", size: 9, color: css("--bad", "#c62828") }, text, hovertemplate: "%{text}<extra></extra>",
        showlegend: false,
      });
    }
  }
  return traces;
}

/**
 * A chart's layout. ``legendRows``: the lines the legend takes; it then sits at the bottom of the chart,
 * below the step axis title (a legend placed in plot coordinates lands on the axis title), the chart
 * growing by its height. ``range``: a fixed y range (a clipped one, see ``chooseScale``; log10 units on a log axis).
 */
export function chartLayout({ title, xAxis = "step", log = false, height = 230, legend = false, legendRows = 1, range = null }) {
  const fg = css("--fg", "#1b1f24");
  const grid = css("--grid", "#d0d7de");
  const legendHeight = legend ? 14 + 19 * legendRows : 0;
  return {
    title: { text: escapeMarkup(title), font: { size: 13, color: fg }, x: 0.01, xanchor: "left" },
    height: height + legendHeight,
    margin: { l: 52, r: 12, t: 30, b: 36 + legendHeight },
    paper_bgcolor: "rgba(0,0,0,0)",
    plot_bgcolor: "rgba(0,0,0,0)",
    font: { color: fg, size: 11 },
    hovermode: "x unified",
    showlegend: legend,
    legend: { orientation: "h", x: 0, xanchor: "left", yref: "container", y: 0, yanchor: "bottom" },
    xaxis: { title: { text: xAxis === "time" ? "time" : "step" }, type: xAxis === "time" ? "date" : "linear", gridcolor: grid, zeroline: false },
    yaxis: { type: log ? "log" : "linear", gridcolor: grid, zeroline: false, exponentformat: "e", automargin: true,
      ...(range ? { range, autorange: false } : {}) },
    yaxis2: { overlaying: "y", range: [0, 1], visible: false, fixedrange: true },
  };
}

/** How many lines a horizontal legend of these names takes in a chart this wide (plotly's entries: a 40 px
    sample, the name at about 6.5 px a character, and a gap; counted generously, as too few lines would lift
    the legend onto the axis title). */
export function legendRows(names, width) {
  const room = Math.max(200, (width || 460) - 24);
  let rows = 1;
  let used = 0;
  for (const name of names) {
    const w = 56 + 7 * String(name).length;
    if (used && used + w > room) {
      rows += 1;
      used = 0;
    }
    used += w;
  }
  return rows;
}

function quantile(sorted, q) {
  const i = (sorted.length - 1) * q;
  const lo = Math.floor(i);
  return sorted[lo] + (sorted[Math.min(lo + 1, sorted.length - 1)] - sorted[lo]) * (i - lo);
}

/** How far beyond the median run's range (in that range's own size, or its level) a value still counts as
    sane: a few runs at different levels (a loss at 2 beside one at 10) all stay in. */
const SANE_REACH = 5;
/** Within the sane runs, a single run's own blow-up (1e34 in a curve at 0.1..2.5): beyond this many times
    the spread and level of the values, a value is off the chart. Wide: a steep start (10 down to 0.05) stays. */
const BLOWUP_REACH = 1000;
/** A run "spans decades" when its largest value is at least this many times its smallest (all positive). */
const DECADES = 100;

function finiteOf(values) {
  return values.filter((v) => v !== null && v !== undefined && Number.isFinite(v));
}

/**
 * The y scale that keeps every run readable when one run's values are far off the others' (a diverged run
 * at 1e34 would flatten every other run to a line at 0): ``{log, range, bounds, note}``.
 *
 * ``runs``: one array of values per run (a flat array of numbers is one run; null, NaN and Inf are skipped).
 * The range is that of the sane values: those within a few times the *median* run's range of it (never the
 * largest run's: one diverged run cannot stretch the axis), and, within them, no single blow-up a thousand
 * times beyond the values' spread. What lies outside is off the chart; ``bounds`` (data units) are the drawn
 * range, for ``leaveMarkers``, and the note under the chart says so. A log scale only when the user asks
 * (``userLog``) or when every run spans decades by itself: never because one run blew up (then the others
 * would be squeezed into a sliver). ``range`` is in the axis' units (log10 on a log axis); null: plotly's own.
 */
export function chooseScale(runs, userLog = false) {
  const list = runs.length && !Array.isArray(runs[0]) ? [runs] : runs;
  const perRun = list.map(finiteOf).filter((r) => r.length);
  const everyDecades = perRun.length > 0 && perRun.every((r) => r.length >= 2 && Math.min(...r) > 0 && Math.max(...r) / Math.min(...r) >= DECADES);
  const log = Boolean(userLog) || everyDecades;
  const all = perRun.flat();
  const plain = { log, range: null, bounds: null, note: null };
  if (all.length < 2) return plain;
  if (!userLog && everyDecades) plain.note = "log scale: every run's values span decades";
  // 1. the median run (the lower median: of two runs, the tamer one) and how far from it a sane value lies
  const spans = perRun.map((r) => [Math.min(...r), Math.max(...r)]).sort((a, b) => (a[1] - a[0]) - (b[1] - b[0]));
  const [mLo, mHi] = spans[Math.floor((spans.length - 1) / 2)];
  const reach = SANE_REACH * (Math.max(mHi - mLo, Math.abs(mHi), Math.abs(mLo)) || 1);
  let kept = all.filter((v) => v >= mLo - reach && v <= mHi + reach);
  // 2. a blow-up inside one run (the panel's single run, or a sane run's spike)
  if (kept.length >= 4) {
    const sorted = [...kept].sort((a, b) => a - b);
    const median = quantile(sorted, 0.5);
    const far = BLOWUP_REACH * ((quantile(sorted, 0.75) - quantile(sorted, 0.25)) + Math.abs(median) || 1);
    kept = kept.filter((v) => Math.abs(v - median) <= far);
  }
  if (log) kept = kept.filter((v) => v > 0);
  const shown = log ? all.filter((v) => v > 0) : all; // a log axis cannot show 0 or below: not "off the chart"
  const outside = shown.length - kept.length;
  if (!outside || !kept.length) return plain;
  const a = Math.min(...kept);
  const b = Math.max(...kept);
  const lo = Math.min(...shown);
  const hi = Math.max(...shown);
  let range;
  let bounds;
  if (log) {
    const la = Math.log10(a);
    const lb = Math.log10(b);
    const pad = (lb - la) * 0.05 || 0.1;
    range = [la - pad, lb + pad];
    bounds = [10 ** range[0], 10 ** range[1]];
  } else {
    const pad = (b - a) * 0.05 || Math.abs(b) * 0.05 || 1;
    range = [a - pad, b + pad];
    bounds = range;
  }
  return {
    log,
    range,
    bounds,
    note: `${log ? "log scale, " : ""}range clipped to ${fmtNum(a)} – ${fmtNum(b)}: ${outside} value${outside === 1 ? "" : "s"} off the chart (from ${fmtNum(lo)} to ${fmtNum(hi)}); ▲ ▼ mark where a run leaves it`,
  };
}

/**
 * Markers at the chart's top (▲) or bottom (▼) edge where a run leaves the drawn range (``scale.bounds``),
 * one at the first point of each excursion, its hover giving the run, the step and the value.
 * ``runs``: ``[{name, color, x, values}]`` (values as in ``columns``). No trace when nothing leaves it.
 */
export function leaveMarkers(runs, scale) {
  if (!scale.bounds) return [];
  const [low, high] = scale.bounds;
  const traces = [];
  for (const run of runs) {
    const xs = [];
    const ys = [];
    const symbols = [];
    const text = [];
    let was = 0; // 0 inside, 1 above, -1 below
    run.values.forEach((v, i) => {
      const where = v === null || !Number.isFinite(v) ? was : v > high ? 1 : v < low ? -1 : 0;
      if (where && where !== was) {
        xs.push(run.x[i]);
        ys.push(where > 0 ? 0.97 : 0.03);
        symbols.push(where > 0 ? "triangle-up" : "triangle-down");
        text.push(`${escapeMarkup(run.name)} leaves the chart ${where > 0 ? "above" : "below"}: ${fmtNum(v)}`);
      }
      was = where;
    });
    if (xs.length) {
      traces.push({
        x: xs, y: ys, yaxis: "y2", type: "scatter", mode: "markers", name: `${escapeMarkup(run.name)} off the chart`,
        marker: { symbol: symbols, size: 10, color: run.color || PALETTE[0], line: { width: 1, color: css("--fg", "#1b1f24") } },
        text, hovertemplate: "%{text}<extra></extra>", showlegend: false,
      });
    }
  }
  return traces;
}

export const CHART_CONFIG = {
  responsive: true,
  displaylogo: false,
  modeBarButtonsToRemove: ["select2d", "lasso2d", "toImage"],
};

/** Draw or redraw a chart in place (plotly keeps the zoom when uirevision stays the same). */
export async function draw(div, traces, layout) {
  const Plotly = await loadPlotly();
  layout.uirevision = div.dataset.uirevision || "keep";
  await Plotly.react(div, traces, layout, CHART_CONFIG);
}
