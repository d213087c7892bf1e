// The side panel of one job: progress, live charts of every metric, health with its evidence, cost,
// events, hyperparameters, and the actions (checkpoint, stop) with a confirmation.

import { getJSON, historyPath, jobPath, postJSON, putJSON } from "./api.js";
import { chartLayout, chooseScale, columns, draw, leaveMarkers, loadPlotly, seriesTraces } from "./charts.js";
import { h, replace } from "./dom.js";
import {
  DASH, ENDED, HEALTH_STATES, JOB_STATES, eventLabel, evidenceFacts, fmtClock, fmtDateTime, fmtDuration, fmtMoney, fmtNum, fmtOf,
  fmtProgress, fmtRate, fmtValue, healthLabel, isEvalMetric, metricOrder, shownPercent, stateClass,
} from "./format.js";
import { remaining } from "./list.js";
import { state, subscribe } from "./state.js";

// 600: a chart is a few hundred pixels wide, and the server answers from its coarser roll-ups (30 ms rather than
// 800 ms for 5 x 100,000 windows at 1,000 points)
const MAX_POINTS = 600;
const POLICY_ACTIONS = ["none", "notify", "checkpoint_stop", "stop"];
const NOTIFY_ONLY = ["finished", "failed", "late"];
const POLICY_TRIGGERS = ["stalled", "not_learning", "diverging", "over_budget", "past_deadline", "late", "finished", "failed"];
const LIVE_REDRAW_MS = 150;
const chartPrefs = { xAxis: "step", log: false, smoothing: 0, band: true };

let current = null;

/** Open the panel on a job ("namespace/name"); the previous one closes. */
export function openPanel(key, { onClose } = {}) {
  if (current && current.key === key) return;
  closePanel();
  current = new Panel(key, onClose);
}

export function closePanel() {
  if (current) {
    current.destroy();
    current = null;
  }
}

export function panelKey() {
  return current ? current.key : null;
}

function askConfirm(title, text, danger) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-title").textContent = title;
  document.getElementById("confirm-text").textContent = text;
  const ok = document.getElementById("confirm-ok");
  ok.className = danger ? "danger" : "primary";
  ok.textContent = title;
  const reason = document.getElementById("confirm-reason");
  reason.value = "";
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok" ? reason.value : null), { once: true });
    dialog.returnValue = "";
    dialog.showModal();
    reason.focus();
  });
}

class Panel {
  constructor(key, onClose) {
    this.key = key;
    const i = key.indexOf("/");
    this.namespace = key.slice(0, i);
    this.name = key.slice(i + 1);
    this.onClose = onClose;
    this.series = {}; // metric -> points
    this.charts = new Map(); // metric -> {div, drawn, dirty}
    this.view = state.jobs.get(key) || null;
    this.events = [];
    this.returnFocus = document.activeElement;
    this.el = document.getElementById("panel");
    this.el.hidden = false;
    this.el.setAttribute("aria-label", `Job ${this.name}`);
    this.build();
    this.unsubscribe = subscribe((kind, detail) => this.onUpdate(kind, detail));
    this.keyHandler = (e) => {
      if (e.key === "Escape" && !document.getElementById("confirm").open) this.close();
    };
    document.addEventListener("keydown", this.keyHandler);
    this.observer = new IntersectionObserver((entries) => {
      for (const entry of entries) if (entry.isIntersecting) this.drawChart(entry.target.dataset.metric);
    }, { root: this.el, rootMargin: "200px" });
    this.load();
  }

  build() {
    this.title = h("h2", { id: "panel-title", tabindex: "-1" }, this.name);
    this.badges = h("div", { class: "badges" });
    this.status = h("p", { class: "message", role: "status", "aria-live": "polite", "data-testid": "panel-status" });
    this.checkpointButton = h("button", { type: "button", onclick: () => this.command("checkpoint") }, "Checkpoint");
    this.stopButton = h("button", { type: "button", class: "danger", onclick: () => this.command("stop") }, "Stop…");
    this.progress = h("section", { class: "progress-section", "aria-labelledby": "p-progress" });
    this.health = h("section", { "aria-labelledby": "p-health" });
    this.cost = h("section", { "aria-labelledby": "p-cost" });
    this.chartGrid = h("div", { class: "charts", "data-testid": "charts" }, h("p", { class: "muted" }, "Loading charts…"));
    this.eventList = h("ol", { class: "timeline", "data-testid": "events" });
    this.params = h("div", { "data-testid": "params" });
    this.pending = h("ul", { class: "pending", "data-testid": "pending" });
    this.policy = h("div", { "data-testid": "policy" }, h("p", { class: "muted" }, "Loading…"));
    const controls = this.chartControls();
    replace(this.el,
      h("header", { class: "panel-head" },
        h("div", null, this.title, h("p", { class: "muted ns" }, `namespace ${this.namespace}`), this.badges),
        h("button", { type: "button", class: "close", "aria-label": "Close the job panel", onclick: () => this.close() }, "×")),
      h("div", { class: "actions", role: "group", "aria-label": "Actions" }, this.checkpointButton, this.stopButton,
        h("a", { class: "button", href: `#/compare/${this.key}` }, "Compare…")),
      this.status, this.pending,
      this.progress,
      h("section", { "aria-labelledby": "p-charts" }, h("h3", { id: "p-charts" }, "Metrics"), controls, this.chartGrid),
      h("div", { class: "two" }, this.health, this.cost),
      h("section", { "aria-labelledby": "p-events" }, h("h3", { id: "p-events" }, "Events"), this.eventList),
      h("section", { "aria-labelledby": "p-params" }, h("h3", { id: "p-params" }, "Hyperparameters"), this.params),
      h("section", { "aria-labelledby": "p-policies" }, h("h3", { id: "p-policies" }, "Policies"), this.policy));
    this.title.focus();
  }

  chartControls() {
    const xStep = h("input", { type: "radio", name: "p-x", id: "p-x-step", value: "step", checked: chartPrefs.xAxis === "step" });
    const xTime = h("input", { type: "radio", name: "p-x", id: "p-x-time", value: "time", checked: chartPrefs.xAxis === "time" });
    const log = h("input", { type: "checkbox", id: "p-log", checked: chartPrefs.log });
    const band = h("input", { type: "checkbox", id: "p-band", checked: chartPrefs.band });
    const smoothing = h("input", { type: "range", id: "p-smooth", min: "0", max: "0.99", step: "0.01", value: String(chartPrefs.smoothing) });
    const smoothValue = h("output", { for: "p-smooth" }, String(chartPrefs.smoothing));
    const changed = () => {
      chartPrefs.xAxis = xTime.checked ? "time" : "step";
      chartPrefs.log = log.checked;
      chartPrefs.band = band.checked;
      chartPrefs.smoothing = Number(smoothing.value);
      smoothValue.textContent = smoothing.value;
      for (const chart of this.charts.values()) chart.dirty = true;
      this.redrawVisible();
    };
    for (const input of [xStep, xTime, log, band, smoothing]) input.addEventListener("input", changed);
    return h("div", { class: "chart-controls" },
      h("fieldset", null, h("legend", null, "x axis"), xStep, h("label", { for: "p-x-step" }, "step"), xTime, h("label", { for: "p-x-time" }, "time")),
      h("span", null, log, h("label", { for: "p-log" }, "log scale")),
      h("span", null, band, h("label", { for: "p-band" }, "min–max band")),
      h("span", null, h("label", { for: "p-smooth" }, "smoothing"), smoothing, smoothValue));
  }

  async load() {
    const path = jobPath(this.namespace, this.name);
    loadPlotly().catch(() => {}); // while the job and its history are read
    try {
      const [view, events] = await Promise.all([getJSON(path), getJSON(`${path}/events?limit=200`)]);
      if (this.destroyed) return;
      this.view = { ...view, _at: Date.now() / 1000 };
      this.events = events.items.slice().reverse();
      this.renderAll();
      this.loadPolicy();
      const names = metricOrder(view.metric_names || []);
      const commas = names.some((n) => n.includes(","));
      const history = await getJSON(historyPath(this.namespace, this.name, commas ? [] : names, MAX_POINTS));
      if (this.destroyed) return;
      for (const name of names) this.series[name] = history.metrics[name] || [];
      this.buildCharts(names);
    } catch (err) {
      if (!this.destroyed) this.status.textContent = `Could not read ${this.key}: ${err.message}`;
    }
  }

  renderAll() {
    this.renderHead();
    this.renderProgress();
    this.renderHealth();
    this.renderCost();
    this.renderEvents();
    this.renderParams();
    this.renderPending();
  }

  renderHead() {
    const v = this.view;
    replace(this.badges,
      h("span", { class: `badge ${stateClass("s", v.state, JOB_STATES)}`, "data-testid": "panel-state" }, v.state),
      h("span", { class: `badge ${stateClass("h", v.health.state, HEALTH_STATES)}`, "data-testid": "panel-health" }, healthLabel(v.health.state)),
      v.attempt > 1 ? h("span", { class: "muted" }, `attempt ${v.attempt}`) : null);
    const ended = ENDED.has(v.state);
    this.stopButton.disabled = ended;
    this.checkpointButton.disabled = ended;
  }

  renderProgress() {
    const v = this.view;
    const p = v.progress;
    const now = Date.now() / 1000;
    const rest = remaining(v, now);
    const items = [
      // a posted ETA (Kubeflow clients) is shown as the job's, never as stepwatch's own estimate
      [v.eta && v.eta.source === "reported" ? "Time remaining (reported)" : "Time remaining", ENDED.has(v.state) ? DASH : fmtDuration(rest)],
      ["Estimated finish", rest === null || ENDED.has(v.state) ? DASH : fmtDateTime(now + rest)],
      ["Completed steps", fmtOf(p.step, p.total_steps)],
      ["Epochs", p.epoch === null ? DASH : `${fmtNum(p.epoch, 3)}${p.total_epochs ? ` of ${fmtNum(p.total_epochs, 3)}` : ""}`],
      // the server's rates as sent; a stalled or ended job has none ("—, stalled since 14:05")
      ["Steps / s", fmtRate(v, p.steps_per_second)],
      ["Samples / s", fmtRate(v, p.samples_per_second)],
      ["Elapsed", fmtDuration(v.times.elapsed_seconds === null ? null : v.times.elapsed_seconds + (ENDED.has(v.state) ? 0 : now - v._at))],
      ["Last report", v.times.last_report === null ? "never" : `${fmtDuration(now - v.times.last_report)} ago`],
      ["Ranks", String(p.world_size ?? 1)],
    ];
    if (v.eta && v.eta.reported_seconds !== null && v.eta.reported_seconds !== undefined) items.push(["ETA the job reported", fmtDuration(v.eta.reported_seconds)]);
    const summary = ENDED.has(v.state) ? reportedEnd(v) : null;
    if (summary) items.push(["OpenShift AI summary", summary]);
    const percent = shownPercent(p.percent); // the bar and its number: one value, by the one rounding rule
    replace(this.progress,
      h("h3", { id: "p-progress" }, "Progress"),
      h("div", { class: "big-progress" },
        h("div", { class: "bar", role: "progressbar", "aria-valuemin": "0", "aria-valuemax": "100", "aria-valuenow": String(percent ?? 0), "aria-label": "Progress" },
          h("div", { class: "fill", style: { width: `${percent ?? 0}%` } })),
        h("span", { class: "pct", "data-testid": "panel-percent" }, fmtProgress(v.state, percent))),
      facts(items, { "data-testid": "progress-facts" }),
      this.latestValues(),
      this.ranksTable());
  }

  latestValues() {
    // the last value of every metric, as OpenShift AI's drawer lists them: the train metrics, then the eval ones
    const metrics = this.view.metrics || {};
    const names = metricOrder(Object.keys(metrics));
    if (!names.length) return null;
    const group = (title, chosen) => chosen.length ? [h("h4", null, title),
      facts(chosen.map((n) => [n, fmtValue(metrics[n])]))] : [];
    const evals = names.filter(isEvalMetric);
    const train = names.filter((n) => !isEvalMetric(n));
    return h("div", { class: "latest", "data-testid": "latest-values" },
      ...(evals.length ? [...group("Train metrics", train), ...group("Eval metrics", evals)] : group("Latest values", train)));
  }

  ranksTable() {
    const ranks = this.view.ranks;
    if (!ranks || ranks.length < 2) return null;
    return h("table", { class: "small" }, h("caption", null, "Ranks (stragglers and hanging ranks show here)"),
      h("thead", null, h("tr", null, ["rank", "step", "step time", "host", "last report"].map((c) => h("th", { scope: "col" }, c)))),
      h("tbody", null, ranks.map((r) => h("tr", null, h("td", null, r.rank), h("td", null, fmtOf(r.step)),
        h("td", null, r.step_time === null ? DASH : `${fmtNum(r.step_time, 3)} s`), h("td", null, r.host || DASH),
        h("td", null, `${fmtDuration(r.last_report_age_seconds)} ago`)))));
  }

  renderHealth() {
    const health = this.view.health;
    const ev = health.evidence || {};
    const details = evidenceFacts(ev);
    replace(this.health,
      h("h3", { id: "p-health" }, "Health"),
      h("p", null, h("span", { class: `badge ${stateClass("h", health.state, HEALTH_STATES)}` }, healthLabel(health.state)),
        health.since ? ` since ${fmtDateTime(health.since)}` : ""),
      ev.message ? h("p", { class: "evidence", "data-testid": "evidence" }, String(ev.message)) : null,
      details.length ? facts(details, { class: "facts small", "data-testid": "evidence-facts" }) : null,
      this.historyTable());
  }

  historyTable() {
    // every verdict the job had, kept after it recovers or ends (as `stepwatch describe` shows it); a job
    // that was only ever healthy has nothing to add
    const spans = this.view.health_history || [];
    if (!spans.some((s) => s.state !== "healthy")) return null;
    const ended = ENDED.has(this.view.state);
    return h("table", { class: "small history", "data-testid": "health-history" }, h("caption", null, "Health history"),
      h("thead", null, h("tr", null, ["health", "from", "stood", "cost"].map((c) => h("th", { scope: "col" }, c)))),
      h("tbody", null, spans.map((s) => {
        const start = s.since ?? s.from;
        const still = s.to === null && !ended ? ", still" : "";
        const money = s.wasted ? `${fmtMoney(s.wasted)} wasted` : s.cost === null || s.cost === undefined ? DASH : fmtMoney(s.cost);
        return h("tr", { title: s.message || "" },
          h("td", null, h("span", { class: `badge ${stateClass("h", s.state, HEALTH_STATES)}` }, healthLabel(s.state))),
          h("td", null, fmtDateTime(start)), h("td", null, `${fmtDuration(s.seconds)}${still}`),
          h("td", { class: s.wasted >= 0.005 ? "bad" : "" }, money));
      })));
  }

  renderCost() {
    const c = this.view.cost;
    const r = this.view.resources || {};
    // priced when the job said its GPUs and their price (an ended job has no hourly rate, but its cost stays)
    const known = c.rate_per_hour !== null || (r.gpus > 0 && r.gpu_hour_cost > 0) || (c.spent !== null && c.spent !== undefined);
    const ended = ENDED.has(this.view.state);
    const price = r.gpus > 0 && r.gpu_hour_cost > 0 ? ` (${fmtNum(r.gpus, 3)} GPU × ${fmtMoney(r.gpu_hour_cost)})` : "";
    // as sent: an ended job burns nothing now, whatever an older server still sent
    const rate = ended || c.rate_per_hour === null || c.rate_per_hour === undefined
      ? `${DASH}${ended ? ` (${this.view.state}; it cost${price})` : price}` : `${fmtMoney(c.rate_per_hour)}/h${price}`;
    replace(this.cost,
      h("h3", { id: "p-cost" }, "Cost"),
      known
        ? facts([
          ["Rate", rate],
          ["Spent", fmtMoney(c.spent)],
          ["Projected", fmtMoney(c.projected)],
          ["Wasted", `${fmtMoney(c.wasted)}${c.wasted_since ? ` since ${fmtClock(c.wasted_since)}` : ""}`, { class: c.wasted >= 0.005 ? "bad" : "" }], // red from a cent: "$0.00" in red reads as an alarm
        ], { class: "facts one", "data-testid": "cost" })
        : h("p", { class: "muted" }, "Unknown: the job did not say its GPUs and their price (stepwatch run --gpus N --gpu-hour-cost USD)."));
  }

  renderEvents() {
    if (!this.events.length) {
      replace(this.eventList, h("li", { class: "muted" }, "No events yet."));
      return;
    }
    replace(this.eventList, this.events.slice(0, 200).map((e) =>
      h("li", { class: `ev ev-${/^[a-z_]+$/.test(e.kind) ? e.kind : "other"}` },
        h("time", { datetime: new Date(e.t * 1000).toISOString() }, fmtDateTime(e.t)),
        h("span", { class: "kind", title: e.kind }, eventLabel(e.kind)),
        h("span", { class: "text" }, e.message))));
  }

  renderParams() {
    const params = this.view.params || {};
    const keys = Object.keys(params).sort();
    if (!keys.length) {
      replace(this.params, h("p", { class: "muted" }, "None reported."));
      return;
    }
    replace(this.params, h("table", { class: "small kv" }, h("tbody", null,
      keys.map((k) => h("tr", null, h("th", { scope: "row" }, k), h("td", null, showValue(k, params[k])))))));
  }

  renderPending() {
    const pending = this.view.pending_commands || [];
    // an ended job reports no more: its unacknowledged commands are history, not a promise
    const fate = ENDED.has(this.view.state)
      ? `the job ${this.view.state} before it reported again`
      : "the job gets it at its next report";
    replace(this.pending, pending.map((c) => h("li", null, `${c.kind} queued${c.reason ? `: ${c.reason}` : ""} — ${fate}`)));
  }

  async loadPolicy() {
    try {
      this.renderPolicy(await getJSON(`${jobPath(this.namespace, this.name)}/policy`));
    } catch (err) {
      replace(this.policy, h("p", { class: "muted" }, err.code === 404 || err.code === 405
        ? "This server has no policy API."
        : `Could not read the policy: ${err.message}`));
    }
  }

  renderPolicy(view) {
    const layer = view.job || {};
    const on = layer.on || {};
    const effective = (view.effective && view.effective.on) || {};
    const setBy = view.set_by || {};
    const save = async (next) => {
      try {
        const saved = await putJSON(`${jobPath(this.namespace, this.name)}/policy`, next);
        this.status.textContent = "Policy saved; it applies at once.";
        this.renderPolicy(saved);
      } catch (err) {
        this.status.textContent = `The policy was not saved: ${err.message}`;
      }
    };
    const rows = POLICY_TRIGGERS.map((trigger) => {
      const id = `pol-${trigger}`;
      const actions = NOTIFY_ONLY.includes(trigger) ? ["none", "notify"] : POLICY_ACTIONS;
      const inherited = effective[trigger] || "none";
      const select = h("select", { id, onchange: () => {
        const nextOn = { ...on };
        if (select.value) nextOn[trigger] = select.value;
        else delete nextOn[trigger];
        save({ ...layer, on: nextOn });
      } },
      h("option", { value: "", selected: !on[trigger] }, `as set above (${inherited.replace("_", " then ")}${setBy[trigger] ? `, ${setBy[trigger]}` : ""})`),
      actions.map((a) => h("option", { value: a, selected: on[trigger] === a }, a.replace("_", " then "))));
      return h("tr", null, h("th", { scope: "row" }, h("label", { for: id }, trigger.replace("_", " "))), h("td", null, select));
    });
    const dry = h("input", { type: "checkbox", id: "pol-dry", checked: Boolean(layer.dry_run), onchange: () => save({ ...layer, dry_run: dry.checked }) });
    const fired = Object.entries(view.fired || {});
    replace(this.policy,
      h("p", { class: "muted" }, "What stepwatch does when this job goes bad. The job's choice wins over its namespace's and the server's."),
      h("table", { class: "small kv" }, h("tbody", null, rows)),
      h("p", null, dry, h("label", { for: "pol-dry" }, " dry run (record what would happen, do nothing)")),
      fired.length ? h("p", null, `Acted on: ${fired.map(([k, v]) => firedText(k, v)).join("; ")}`) : null);
  }

  buildCharts(names) {
    if (!names.length) {
      replace(this.chartGrid, h("p", { class: "muted" }, "No metrics reported yet."));
      this.pendingNames = true;
      return;
    }
    this.pendingNames = false;
    this.chartGrid.replaceChildren();
    for (const name of names) this.addChart(name);
    loadPlotly().catch((err) => {
      replace(this.chartGrid, h("p", { class: "bad" }, `Charts are unavailable: ${err.message}`));
    });
  }

  addChart(name) {
    const div = h("div", { class: "chart", role: "img", "aria-label": `Chart of ${name}`, dataset: { metric: name } });
    const note = h("p", { class: "chart-note", hidden: true });
    this.chartGrid.append(h("div", { class: "chart-box" }, div, note));
    this.charts.set(name, { div, note, drawn: false, dirty: true, visible: false });
    this.observer.observe(div);
  }

  drawChart(name) {
    const chart = this.charts.get(name);
    if (!chart) return;
    chart.visible = true;
    if (!chart.dirty) return;
    chart.dirty = false;
    chart.drawn = true;
    const traces = seriesTraces(this.series[name] || [], { name, xAxis: chartPrefs.xAxis, smoothing: chartPrefs.smoothing, band: chartPrefs.band });
    // a blow-up (1e34) would flatten the rest of the curve: a clipped range, said under the chart and marked
    // where the curve leaves it (a log scale only when asked for, or when the values span decades)
    const c = columns(this.series[name] || []);
    const scale = chooseScale([c.values], chartPrefs.log);
    traces.push(...leaveMarkers([{ name, x: chartPrefs.xAxis === "time" ? c.times : c.steps, values: c.values }], scale));
    chart.note.hidden = !scale.note;
    chart.note.textContent = scale.note || "";
    const layout = chartLayout({ title: name, xAxis: chartPrefs.xAxis, log: scale.log, range: scale.range });
    chart.div.dataset.points = String((this.series[name] || []).length);
    draw(chart.div, traces, layout).catch(() => {});
  }

  redrawVisible() {
    for (const [name, chart] of this.charts) if (chart.visible) this.drawChart(name);
  }

  scheduleRedraw() {
    if (this.redrawTimer) return;
    this.redrawTimer = setTimeout(() => {
      this.redrawTimer = null;
      if (!this.destroyed) this.redrawVisible();
    }, LIVE_REDRAW_MS);
  }

  onUpdate(kind, detail) {
    if (this.destroyed) return;
    if (kind === "job" && detail.key === this.key && this.view) {
      // the stream sends the compact view (as lists read it): what only the panel's own read of the job
      // carries stays as that read gave it
      const { metric_names, pending_commands, ranks, params, health_history } = this.view;
      this.view = { ...detail.job, metric_names, pending_commands, ranks, params, health_history };
      if (ENDED.has(detail.job.state)) {
        this.view.pending_commands = [];
        this.renderPending();
        if (this.status.textContent.includes("queued")) {
          const short = fmtProgress(detail.job.state, detail.job.progress.percent);
          this.status.textContent = `The job has ${detail.job.state}${short.startsWith("ended at") ? ` (${short})` : ""}.`;
        }
      }
      this.renderHead();
      this.renderProgress();
      this.renderHealth();
      this.renderCost();
    } else if (kind === "points" && detail.key === this.key) {
      for (const [name, point] of Object.entries(detail.points)) {
        if (!this.series[name]) {
          this.series[name] = [];
          if (this.pendingNames) {
            this.chartGrid.replaceChildren();
            this.pendingNames = false;
          }
          this.addChart(name);
          loadPlotly().catch(() => {});
        }
        this.series[name].push(point);
        const chart = this.charts.get(name);
        if (chart) chart.dirty = true;
      }
      this.scheduleRedraw();
    } else if (kind === "event" && detail.key === this.key) {
      const { key: _key, ...event } = detail; // the event as the events API reads it back
      this.events.unshift(event);
      this.renderEvents();
      // what the stream's compact view lacks (pending commands, the verdict history) changes with these
      if (detail.kind === "command" || detail.kind === "health" || ENDED.has(detail.kind)) this.refreshJob();
    } else if (kind === "resync" || (kind === "live" && detail === "live")) {
      // the stream (re)opened or missed updates: read the job and its series again
      this.refreshJob();
      this.reloadSeries();
    }
  }

  async reloadSeries() {
    if (!this.view || this.reloading) return;
    this.reloading = true;
    try {
      const view = await getJSON(jobPath(this.namespace, this.name));
      const names = metricOrder(view.metric_names || []);
      const commas = names.some((n) => n.includes(","));
      const history = await getJSON(historyPath(this.namespace, this.name, commas ? [] : names, MAX_POINTS));
      if (this.destroyed) return;
      for (const name of names) {
        this.series[name] = history.metrics[name] || [];
        if (this.charts.has(name)) this.charts.get(name).dirty = true;
        else {
          if (this.pendingNames) {
            this.chartGrid.replaceChildren();
            this.pendingNames = false;
          }
          this.addChart(name);
          loadPlotly().catch(() => {});
        }
      }
      this.redrawVisible();
    } catch {
      /* the banner says it */
    } finally {
      this.reloading = false;
    }
  }

  async refreshJob() {
    try {
      const view = await getJSON(jobPath(this.namespace, this.name));
      if (this.destroyed) return;
      this.view = { ...view, _at: Date.now() / 1000 };
      this.renderAll();
    } catch {
      /* the banner says it */
    }
  }

  async command(kind) {
    const stop = kind === "stop";
    const reason = await askConfirm(stop ? "Stop" : "Checkpoint",
      stop
        ? `Stop ${this.name}? The job is asked to save a checkpoint and stop at its next step; a job started by \`stepwatch run\` is ended after a grace period.`
        : `Ask ${this.name} to save a checkpoint at its next step?`,
      stop);
    if (reason === null) {
      this.stopButton.focus();
      return;
    }
    try {
      const made = await postJSON(`${jobPath(this.namespace, this.name)}/commands`, { kind, reason });
      // the job may have ended (and the stream said so) while the request was on its way
      this.status.textContent = this.view && ENDED.has(this.view.state)
        ? `${kind} queued (command ${made.id}); the job has ${this.view.state}.`
        : `${kind} queued (command ${made.id}); the job gets it at its next report.`;
      this.refreshJob();
    } catch (err) {
      this.status.textContent = `${kind} failed: ${err.message}`;
    }
  }

  close() {
    if (this.onClose) this.onClose();
    else closePanel();
  }

  destroy() {
    this.destroyed = true;
    this.unsubscribe();
    this.observer.disconnect();
    clearTimeout(this.redrawTimer);
    document.removeEventListener("keydown", this.keyHandler);
    if (window.Plotly) for (const chart of this.charts.values()) if (chart.drawn) window.Plotly.purge(chart.div);
    this.el.hidden = true;
    this.el.replaceChildren();
    if (this.returnFocus && document.contains(this.returnFocus)) this.returnFocus.focus();
  }
}

/** Facts as a definition list, each label and its value one grid item (they stay side by side at any width). */
function facts(items, attrs = {}) {
  return h("dl", { class: "facts", ...attrs }, items.map(([label, value, ddAttrs]) =>
    h("div", null, h("dt", null, label), h("dd", ddAttrs || null, value))));
}

/** How OpenShift AI's controller summed up the job's end ("complete (early stopped)", "failed at 60%"), when it did. */
function reportedEnd(view) {
  const metrics = (view.trainerStatus && view.trainerStatus.metrics) || [];
  const said = metrics.filter((m) => m && m.name === "estimatedRemainingTimeSummary");
  return said.length ? String(said[said.length - 1].value) : null;
}

/** What a policy did on a trigger: "diverging: stop at 6 Dec, 01:15:36" ("would stop" in a dry run). */
function firedText(trigger, fired) {
  const what = trigger.replaceAll("_", " ");
  if (!fired || typeof fired !== "object") return what;
  const action = fired.action ? `${fired.dry_run ? "would " : ""}${String(fired.action).replaceAll("_", " then ")}` : "acted";
  return `${what}: ${action}${fired.t ? ` at ${fmtDateTime(fired.t)}` : ""}`;
}

function showValue(key, value) {
  if (value === null || value === undefined) return DASH;
  if (typeof value === "number" && /since|_at$|^t$/.test(key) && value > 1e9) return fmtDateTime(value);
  if (typeof value === "object") return JSON.stringify(value);
  return String(value);
}

