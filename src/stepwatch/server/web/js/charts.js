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
 * growing by its height. ``range``: a fixed y range (a clipped one, see ``chooseScale``).
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
      ...(range && !log ? { range, autorange: false } : {}) },
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

/**
 * The y scale that keeps every run readable when one run's values are far off the others' (a diverged
 * run at 1e34 would flatten every other run to a line at 0): ``{log, range, note}``. Values beyond ten
 * interquartile ranges of all the runs' values are outliers; with outliers, a log scale when every value
 * is positive, else a range clipped to the rest (the outliers run off the chart, and the note says so).
 * ``note`` is null when the user's choice (or a linear scale) shows everything well.
 */
export function chooseScale(values, userLog) {
  const finite = values.filter((v) => v !== null && Number.isFinite(v)).sort((a, b) => a - b);
  if (userLog || finite.length < 4) return { log: userLog, range: null, note: null };
  const q1 = quantile(finite, 0.25);
  const q3 = quantile(finite, 0.75);
  const spread = q3 - q1 || Math.abs(quantile(finite, 0.5)) * 0.1 || 1;
  const low = q1 - 10 * spread;
  const high = q3 + 10 * spread;
  const inside = finite.filter((v) => v >= low && v <= high);
  const outside = finite.length - inside.length;
  if (!outside) return { log: false, range: null, note: null };
  const lo = finite[0];
  const hi = finite[finite.length - 1];
  if (lo > 0) return { log: true, range: null, note: `log scale, chosen because the values span ${fmtNum(lo)} to ${fmtNum(hi)}` };
  const a = inside[0];
  const b = inside[inside.length - 1];
  const pad = (b - a) * 0.05 || Math.abs(b) * 0.05 || 1;
  return {
    log: false,
    range: [a - pad, b + pad],
    note: `range clipped to ${fmtNum(a)} – ${fmtNum(b)}: ${outside} value${outside === 1 ? "" : "s"} off the chart (from ${fmtNum(lo)} to ${fmtNum(hi)})`,
  };
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
