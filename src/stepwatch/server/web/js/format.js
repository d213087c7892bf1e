// How figures are written: numbers, money, durations, times. Unknown is "—", never 0.

export const DASH = "—";

/** A wire float: a number, or "NaN" / "Infinity" / "-Infinity" (non-finite values travel as strings). */
export function num(value) {
  if (typeof value === "number") return value;
  if (value === "NaN") return NaN;
  if (value === "Infinity") return Infinity;
  if (value === "-Infinity") return -Infinity;
  return null;
}

export function fmtNum(value, digits = 4) {
  const v = num(value);
  if (v === null) return DASH;
  if (Number.isNaN(v)) return "NaN";
  if (!Number.isFinite(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v === 0) return "0";
  const a = Math.abs(v);
  // 3.3e+15, not 3.300e+15: the mantissa keeps only the digits it needs
  if (a >= 1e6 || a < 1e-3) return v.toExponential(Math.max(digits - 2, 1)).replace(/\.?0+e/, "e");
  return String(Number(v.toPrecision(digits)));
}

export function fmtInt(value) {
  return value === null || value === undefined ? DASH : Math.round(value).toLocaleString("en-US");
}

/**
 * A percentage as every reader shows it (the rule of stepwatch.server.views.figures.shown_percent): one
 * decimal rounded down (9.96 reads 9.9, 99.99 reads 99.9), within 0..100, 100 only at 100. The server
 * sends a job's ``progress.percent`` already so: this leaves it as sent (flooring a tenth again is a no-op;
 * the sixth-decimal rounding keeps 29.999999999999996 at 30.0), and holds the rule for any other figure.
 * The list's bar is drawn from this same value, so a bar and the number beside it never disagree.
 */
export function shownPercent(value) {
  const v = num(value);
  if (v === null || !Number.isFinite(v)) return null;
  const tenths = Math.floor(Number((Math.min(100, Math.max(0, v)) * 10).toFixed(6)));
  return tenths >= 1000 ? 100 : tenths / 10;
}

export function fmtPercent(value) {
  const v = shownPercent(value);
  return v === null ? DASH : `${v === 100 || v === 0 ? v.toFixed(0) : v.toFixed(1)}%`;
}

/** A job's progress: "45.0%"; "ended at 49.8%" when it ended short of its total (the rule of
 * stepwatch.protocol.ended_short_text, which the CLI and the SDK follow, on the percent as shown). */
export function fmtProgress(state, value) {
  const v = shownPercent(value);
  if (ENDED.has(state) && v !== null && v < 100) return `ended at ${Math.min(v, 99.9).toFixed(1)}%`;
  return fmtPercent(value);
}

/**
 * A job's live rate, as the server sends it (``progress.steps_per_second``, ``samples_per_second``): none
 * (null: "—") for a job that has ended or stands stalled, whatever an older server still sent (a rate
 * measured before the job stopped moving is not its rate now).
 */
export function liveRate(job, value) {
  if (ENDED.has(job.state) || (job.health && job.health.state === "stalled")) return null;
  return value ?? null;
}

/** Where a job's rate would be, when it has none: "stalled since 14:05", "ended", or "—". */
export function noRateText(job) {
  if (ENDED.has(job.state)) return `${DASH} (${job.state})`;
  if (job.health && job.health.state === "stalled") return job.health.since ? `${DASH} (stalled since ${fmtClock(job.health.since)})` : `${DASH} (stalled)`;
  return DASH;
}

/** A live rate as a person reads it: the number as sent, or "—" with why there is none. */
export function fmtRate(job, value, digits = 3) {
  const v = liveRate(job, value);
  return v === null ? noRateText(job) : fmtNum(v, digits);
}

/**
 * The LOSS a list shows and its tooltip: the mean of the latest window of the loss metric
 * (``metric_means``: smooth, it does not jump with every batch) when the job view has it, else the last
 * value; the last single batch goes in the tooltip. ``{metric, value, last}``, value null when none.
 */
export function lossFigure(job) {
  const metric = lossMetric(job.metrics);
  if (!metric) return { metric: null, value: null, last: null };
  const last = job.metrics[metric];
  const means = job.metric_means || {};
  const mean = Object.prototype.hasOwnProperty.call(means, metric) && means[metric] !== null ? means[metric] : null;
  // a last batch that went NaN or Inf is shown as such: the window's mean is over its finite values only, and
  // would hide the blow-up (a diverged run read 9.5e+34 where its loss was NaN)
  const lastValue = num(last);
  if (mean === null || (lastValue !== null && !Number.isFinite(lastValue))) return { metric, value: last, last, smoothed: false };
  return { metric, value: mean, last, smoothed: true };
}

export function fmtMoney(value, digits = 2) {
  if (value === null || value === undefined) return DASH;
  return `$${value.toLocaleString("en-US", { minimumFractionDigits: digits, maximumFractionDigits: digits })}`;
}

export function fmtDuration(seconds) {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return DASH;
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m ${String(s % 60).padStart(2, "0")}s`;
  const hours = Math.floor(m / 60);
  if (hours < 48) return `${hours}h ${String(m % 60).padStart(2, "0")}m`;
  return `${Math.floor(hours / 24)}d ${hours % 24}h`;
}

/** A clock time; with the weekday when it is not today. */
export function fmtClock(epochSeconds) {
  if (epochSeconds === null || epochSeconds === undefined) return DASH;
  const d = new Date(epochSeconds * 1000);
  const now = new Date();
  const time = d.toLocaleTimeString("en-GB", { hour: "2-digit", minute: "2-digit" });
  if (d.toDateString() === now.toDateString()) return time;
  return `${d.toLocaleDateString("en-GB", { weekday: "short", day: "numeric", month: "short" })} ${time}`;
}

/** A finish time short enough for a list cell: "14:05" today, "Tue 14:05" within the week, else "3 Mar". */
export function fmtFinish(epochSeconds) {
  if (epochSeconds === null || epochSeconds === undefined) return DASH;
  const d = new Date(epochSeconds * 1000);
  const time = d.toLocaleTimeString("en-GB", { hour: "2-digit", minute: "2-digit" });
  if (d.toDateString() === new Date().toDateString()) return time;
  if (epochSeconds - Date.now() / 1000 < 6 * 86400) return `${d.toLocaleDateString("en-GB", { weekday: "short" })} ${time}`;
  return d.toLocaleDateString("en-GB", { day: "numeric", month: "short" });
}

export function fmtDateTime(epochSeconds) {
  if (epochSeconds === null || epochSeconds === undefined) return DASH;
  return new Date(epochSeconds * 1000).toLocaleString("en-GB", {
    day: "numeric", month: "short", hour: "2-digit", minute: "2-digit", second: "2-digit",
  });
}

export function fmtOf(x, y, digits = 0) {
  if (x === null || x === undefined) return DASH;
  const a = digits ? Number(x).toFixed(digits) : fmtInt(x);
  return y === null || y === undefined ? a : `${a} / ${digits ? Number(y).toFixed(digits) : fmtInt(y)}`;
}

export const HEALTH_LABELS = {
  healthy: "healthy", stalled: "stalled", not_learning: "not learning", diverging: "diverging",
  straggling: "straggling", unknown: "unknown",
};
export const HEALTH_STATES = Object.keys(HEALTH_LABELS);
export const JOB_STATES = ["pending", "running", "finished", "failed", "stopped"];
export const ENDED = new Set(["finished", "failed", "stopped"]);
/** Worst first: what an admin looks at first. */
export const HEALTH_SEVERITY = { diverging: 0, stalled: 1, not_learning: 2, straggling: 3, unknown: 4, healthy: 5 };
export const BAD_HEALTH = new Set(["diverging", "stalled", "not_learning", "straggling"]);

// an event's kind in words (the timeline shows no internal names: "command_acked" is "command received")
const EVENT_LABELS = {
  registered: "registered", running: "running", finished: "finished", failed: "failed", stopped: "stopped",
  command: "command sent", command_acked: "command received", policy: "policy acted", policy_set: "policy set",
  health: "health", attempt: "new attempt",
};

/** An event kind as a person reads it: the known ones in words, any other without its underscores. */
export function eventLabel(kind) {
  return EVENT_LABELS[kind] || String(kind).replaceAll("_", " ");
}

export function healthLabel(state) {
  return HEALTH_LABELS[state] || String(state);
}

/** A class-safe token for a known state (unknown values get a neutral class, never their own text). */
export function stateClass(prefix, value, known) {
  return `${prefix}-${known.includes(value) ? value : "other"}`;
}

/** The metric a job's "loss" column shows. */
export function lossMetric(metrics) {
  const names = Object.keys(metrics || {});
  for (const preferred of ["loss", "train/loss", "train_loss", "training_loss"]) if (names.includes(preferred)) return preferred;
  return names.find((n) => /loss/i.test(n) && !/^eval|^val|^test/i.test(n)) || names.find((n) => /loss/i.test(n)) || null;
}

/** Which way is better for a metric: -1 lower, +1 higher, 0 neither (learning rate, grad norm...). */
export function betterDirection(name) {
  if (/(^|[/_.\-])(lr|learning_rate|grad_norm|epoch|step)$/i.test(name)) return 0;
  if (/loss|err|perplex|ppl|wer|cer|mse|mae|rmse|nll/i.test(name)) return -1;
  if (/acc|f1|auc|bleu|rouge|reward|precision|recall|score|map|iou|exact_match/i.test(name)) return 1;
  return 0;
}

/** Order metric names as a training person reads them: losses, eval, rates, norms, throughput, rest. */
// The metrics OpenShift AI's drawer lists as eval metrics (its annotation's evalMetrics): the prefixes of
// stepwatch.protocol.progression.EVAL_PREFIXES (tests/server/test_web.py keeps the two lists the same).
export const EVAL_PREFIXES = ["eval_", "eval/", "eval.", "val_", "val/", "validation_", "validation/"];

export function isEvalMetric(name) {
  return EVAL_PREFIXES.some((prefix) => name.startsWith(prefix));
}

export function metricOrder(names) {
  const rank = (n) => {
    if (lossMetric({ [n]: 0 }) && !/^eval|^val/i.test(n)) return 0;
    if (/^eval|^val|^test/i.test(n)) return 1;
    if (/lr|learning_rate/i.test(n)) return 2;
    if (/grad/i.test(n)) return 3;
    if (/per_second|throughput|tokens|samples/i.test(n)) return 4;
    return 5;
  };
  return [...names].sort((a, b) => rank(a) - rank(b) || a.localeCompare(b));
}

/** A span of data a verdict looked at: {"seconds": 30, "steps": 574} reads "30s, 574 steps". */
export function fmtWindow(window) {
  if (window === null || window === undefined) return DASH;
  if (typeof window !== "object") return fmtValue(window);
  const parts = [];
  if (window.seconds !== undefined && window.seconds !== null) parts.push(fmtDuration(window.seconds));
  if (window.steps !== undefined && window.steps !== null) parts.push(`${fmtInt(window.steps)} steps`);
  if (window.windows !== undefined && window.windows !== null) parts.push(`${fmtInt(window.windows)} report${window.windows === 1 ? "" : "s"}`);
  for (const [k, v] of Object.entries(window)) if (!["seconds", "steps", "windows"].includes(k)) parts.push(`${k.replaceAll("_", " ")} ${fmtValue(v)}`);
  return parts.length ? parts.join(", ") : DASH;
}

/** Any value the server sends as data, for reading: numbers rounded, times as times, objects as "key value" lists. */
export function fmtValue(value, key = "") {
  if (value === null || value === undefined) return DASH;
  if (typeof value === "number" && /since|_at$|^t$/.test(key) && value > 1e9) return fmtDateTime(value);
  if (typeof value === "number" || num(value) !== null) return fmtNum(value);
  if (typeof value === "boolean") return value ? "yes" : "no";
  if (Array.isArray(value)) return value.map((v) => fmtValue(v)).join(", ");
  if (typeof value === "object") return Object.entries(value).map(([k, v]) => `${k.replaceAll("_", " ")} ${fmtValue(v, k)}`).join(", ");
  return String(value);
}

// what each piece of a health verdict's evidence is, in the order a person reads them
const EVIDENCE_LABELS = {
  metric: "Metric", window: "Measured over", observed: "Observed", threshold: "Threshold",
  level: "Level (recent mean)", best: "Best smoothed level earlier", best_step: "… at step",
  gain: "Improvement per window", noise: "Noise (standard error)", noise_z: "Noise multiple needed",
  learning_rate: "Learning rate", eval_metric: "Evaluation metric", eval_gain: "Evaluation improvement",
  eval_noise: "Evaluation noise", rank: "Rank", step: "At step", kind: "Standing in", activity: "Doing",
  detail: "In the call", frames: "In your code", place: "Where", holding: "Ranks standing",
  waiting: "Ranks waiting for them", step_time: "Usual step time (p99)", phase: "Phase",
  eval_seconds: "Evaluating for", recovered_from: "Recovered from", since: "Since",
  ranks_standing: "Ranks standing", host: "Host", ratio: "Slower than the median rank by",
  speedup_without: "Faster without it by", activity_shares: "Its time goes to",
  median_activity_shares: "The median rank's time goes to", hint: "Without it",
};

// pieces of evidence that only say again what the message says (a straggler's hint, a stall's place), or
// mark it (an ended job's final judgement): shown only when the message does not already hold them
const REPEATS_MESSAGE = new Set(["hint", "place", "final"]);

// the stall checker's internal names for what a rank stands in, in words
const STAND_KINDS = {
  busy: "a training step", patient: "a save or an evaluation", hang: "its own code, a lock or its loader",
};

/** A ratio as a person reads it, with one decimal as the verdict's message says it: 2.44 -> "2.4x", 3 -> "3.0x". */
function fmtTimes(v) {
  const n = num(v);
  return n === null || !Number.isFinite(n) ? DASH : `${n.toFixed(1)}x`;
}

/** Activity shares ({computing: 0.62, loading_data: 0.3}) as "computing 62%, loading data 30%", largest first. */
function fmtShares(shares) {
  if (!shares || typeof shares !== "object") return fmtValue(shares);
  const entries = Object.entries(shares).filter(([, v]) => num(v) !== null).sort((a, b) => num(b[1]) - num(a[1]));
  if (!entries.length) return DASH;
  return entries.map(([k, v]) => `${k.replaceAll("_", " ")} ${Math.round(num(v) * 100)}%`).join(", ");
}

/** Ranks as a person reads them: "rank 0", "ranks 0, 2", "none". */
function fmtRanks(ranks) {
  if (!Array.isArray(ranks)) return fmtValue(ranks);
  if (!ranks.length) return "none";
  return `rank${ranks.length === 1 ? "" : "s"} ${ranks.map((r) => fmtInt(r)).join(", ")}`;
}

/** A frame of the user's code: "fn (file:line)" (the wire's own text), from a string or its fields. */
function fmtFrame(frame) {
  if (frame && typeof frame === "object") return `${frame.function} (${frame.file}:${frame.line})`;
  return String(frame);
}

/** A verdict's evidence (its message aside) as [label, text] pairs, every value formatted: durations with
    their unit (a stall's observed and threshold are seconds), ranks and frames as words, no internal names. */
export function evidenceFacts(evidence) {
  const ev = evidence || {};
  const message = typeof ev.message === "string" ? ev.message : "";
  const repeats = (k, v) => REPEATS_MESSAGE.has(k) && (typeof v !== "string" || v === "" || message.includes(v));
  const entries = Object.entries(ev).filter(([k, v]) => k !== "message" && v !== null && v !== undefined && !repeats(k, v));
  const order = Object.keys(EVIDENCE_LABELS);
  const rank = (k) => (order.includes(k) ? order.indexOf(k) : order.length);
  entries.sort((a, b) => rank(a[0]) - rank(b[0]));
  // a stall's evidence measures time: how long the step has stood against how long it may
  const timed = ev.metric === "step" || ev.metric === "reports";
  // a straggler's evidence measures pace: how many times slower than the median rank, against the rule's ratio
  const paced = ev.metric === "rank_pace";
  const text = (k, v) => {
    if (k === "metric" && paced) return "each rank's pace";
    if ((k === "observed" || k === "threshold") && paced) return fmtTimes(v);
    if (k === "ratio" || k === "speedup_without") return fmtTimes(v);
    if (k === "activity_shares" || k === "median_activity_shares") return fmtShares(v);
    if (k === "ranks_standing") return fmtRanks(v);
    if (k === "window") return fmtWindow(v);
    if (k === "recovered_from") return healthLabel(v);
    if (k === "step" || k.endsWith("_step")) return fmtInt(v);
    if ((k === "observed" || k === "threshold") && timed && typeof v === "number") return fmtDuration(v);
    if (k === "step_time" && typeof v === "number") return `${fmtNum(v, 3)} s`;
    if (k.endsWith("_seconds") && typeof v === "number") return fmtDuration(v);
    if (k === "kind") return STAND_KINDS[v] || String(v).replaceAll("_", " ");
    if (k === "activity" || k === "phase") return String(v).replaceAll("_", " ");
    if (k === "holding" || k === "waiting") return fmtRanks(v);
    if (k === "frames" && Array.isArray(v)) return v.length ? v.map(fmtFrame).join("; ") : DASH;
    return fmtValue(v, k);
  };
  return entries.map(([k, v]) => [EVIDENCE_LABELS[k] || k.replaceAll("_", " "), text(k, v)]);
}
