// What the page knows of the fleet: every job's latest view, kept live by the server-sent events of
// GET /api/v1/events. Views subscribe; updates are batched by the views themselves (no flicker).

import { authNeeded, getJSON, historyPath, keyOf, onNetwork, splitKey } from "./api.js";
import { lossMetric, num } from "./format.js";

/** The API's largest page: a fleet beyond it is listed through the server's filters. */
export const LIST_LIMIT = 10000;
/** The first read of a large fleet: a few screens, drawn while the whole list loads. */
const FIRST_PAGE = 100;
const SPARK_POINTS = 40;

export const state = {
  jobs: new Map(), // key -> job view, with `_at`: the page's clock when the view arrived
  total: 0,
  complete: false, // every job is in `jobs` (else the list asks the server to filter)
  loaded: false,
  partial: false, // only the first page is in `jobs` (the whole list is on its way)
  loadedAt: 0,
  live: "connecting", // connecting | live | reconnecting
  sparks: new Map(), // key -> {metric, values}
};

const listeners = new Set();

/** fn(kind, detail): kind is "jobs" (reloaded), "job", "points", "event", "live". */
export function subscribe(fn) {
  listeners.add(fn);
  return () => listeners.delete(fn);
}

function emit(kind, detail) {
  for (const fn of [...listeners]) {
    try {
      fn(kind, detail);
    } catch (err) {
      console.error("stepwatch: a view failed to update", err);
    }
  }
}

function keep(view) {
  view._at = Date.now() / 1000;
  state.jobs.set(keyOf(view), view);
}

/** Read the list again (at start, after a reconnect, and when the stream says updates were missed). */
export async function loadJobs(params = {}) {
  const filtered = Object.keys(params).some((k) => k !== "sort");
  let full = null;
  if (!state.loaded && !filtered) {
    // first the screenful that the list's default order (newest first) shows, then everything: a large
    // fleet's list (7 MB for 10,000 jobs) must not hold back the first rows
    const first = await getJSON(`/api/v1/jobs?${new URLSearchParams({ limit: String(FIRST_PAGE), sort: "-created", ...params })}`);
    if (first.items.length < first.total) {
      fill(first, false);
      state.partial = true;
      emit("jobs", null);
    } else full = first;
  }
  if (!full) {
    full = await getJSON(`/api/v1/jobs?${new URLSearchParams({ limit: String(LIST_LIMIT), ...params })}`);
  }
  fill(full, !filtered && full.items.length >= full.total);
  state.partial = false;
  emit("jobs", null);
  return full;
}

function fill(page, complete) {
  state.jobs = new Map();
  for (const view of page.items) keep(view);
  state.total = page.total;
  state.complete = complete;
  state.loaded = true;
  state.loadedAt = Date.now() / 1000;
}

let source = null;
let hadError = false;

/** Open the live stream; EventSource reconnects by itself and sends Last-Event-ID. */
export function connect() {
  if (source) return;
  source = new EventSource("/api/v1/events");
  source.addEventListener("open", () => {
    setLive("live");
    if (hadError) {
      hadError = false;
      resync();
    }
  });
  source.addEventListener("error", () => {
    hadError = true;
    setLive("reconnecting");
    // a refused stream (401, 403) is not retried by EventSource: ask whether the token is the reason
    if (source && source.readyState === EventSource.CLOSED) recheck();
  });
  source.addEventListener("unauthorized", () => {
    disconnect();
    authNeeded("the token was revoked or has expired");
  });
  source.addEventListener("job", (e) => {
    const data = parse(e);
    if (!data || !data.job) return;
    const key = keyOf(data.job);
    const old = state.jobs.get(key);
    // an earlier attempt's late update never replaces a newer attempt
    if (old && old.attempt > data.job.attempt) return;
    const isNew = !old;
    keep(data.job);
    if (isNew) state.total += 1;
    emit("job", { key, job: data.job, isNew });
  });
  source.addEventListener("points", (e) => {
    const data = parse(e);
    if (!data) return;
    const key = `${data.namespace}/${data.name}`;
    const spark = state.sparks.get(key);
    if (spark && data.points[spark.metric]) {
      spark.values.push(pointValue(data.points[spark.metric]));
      if (spark.values.length > SPARK_POINTS) spark.values.splice(0, spark.values.length - SPARK_POINTS);
    }
    emit("points", { key, ...data });
  });
  source.addEventListener("event", (e) => {
    const data = parse(e);
    if (data) emit("event", { key: `${data.namespace}/${data.name}`, ...data });
  });
  source.addEventListener("resync", () => resync());
}

/** Close the live stream (a new token opens it again with connect()). */
export function disconnect() {
  if (source) source.close();
  source = null;
}

function recheck() {
  getJSON("/api/v1/whoami")
    .then(() => {
      disconnect();
      setTimeout(connect, 2000);
    })
    .catch((err) => {
      if (err.code === 401) disconnect(); // the page asks for a token (api.js told it)
      else {
        disconnect();
        setTimeout(connect, 2000);
      }
    });
}

function parse(e) {
  try {
    return JSON.parse(e.data);
  } catch {
    return null;
  }
}

let resyncing = null;

function resync() {
  if (resyncing) return;
  resyncing = loadJobs()
    .catch(() => {})
    .finally(() => {
      resyncing = null;
    });
  emit("resync", null);
}

function setLive(value) {
  if (state.live === value) return;
  state.live = value;
  emit("live", value);
}

onNetwork((ok) => {
  if (!ok) setLive("reconnecting");
  else if (source && source.readyState === EventSource.OPEN) setLive("live");
});

/** The value a chart or sparkline draws for a stored window: its mean, else its last value. */
export function pointValue(p) {
  if (p.mean !== null && p.mean !== undefined) return p.mean;
  return num(p.last);
}

// ------------------------------------------------------------------ sparklines, for visible rows only

const sparkQueue = [];
let sparkActive = 0;
const SPARK_CONCURRENCY = 4;

/** Ask for a job's loss sparkline (the API has no batch read: one small history read per visible job). */
export function wantSpark(key, onReady) {
  if (state.sparks.has(key)) return;
  const job = state.jobs.get(key);
  const metric = job && lossMetric(job.metrics);
  if (!metric || metric.includes(",")) return; // a comma cannot be asked for by name
  state.sparks.set(key, { metric, values: [], loading: true });
  sparkQueue.push([key, metric, onReady]);
  pump();
}

function pump() {
  while (sparkActive < SPARK_CONCURRENCY && sparkQueue.length) {
    const [key, metric, onReady] = sparkQueue.shift();
    const [namespace, name] = splitKey(key);
    sparkActive += 1;
    getJSON(historyPath(namespace, name, [metric], SPARK_POINTS))
      .then((data) => {
        const spark = state.sparks.get(key);
        if (!spark) return;
        const points = (data.metrics[metric] || []).map(pointValue);
        spark.values = points.concat(spark.values).slice(-SPARK_POINTS);
        spark.loading = false;
        onReady(key);
      })
      .catch(() => state.sparks.delete(key))
      .finally(() => {
        sparkActive -= 1;
        pump();
      });
  }
}

/** Forget sparklines that were asked for but not yet read (the rows scrolled away). */
export function dropPendingSparks(keepKeys) {
  for (let i = sparkQueue.length - 1; i >= 0; i--) {
    const key = sparkQueue[i][0];
    if (!keepKeys.has(key)) {
      sparkQueue.splice(i, 1);
      state.sparks.delete(key);
    }
  }
}
