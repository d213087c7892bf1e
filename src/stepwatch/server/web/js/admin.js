// The admin view: the whole fleet across namespaces. Counts by state and health, GPUs in use and the
// burn rate, the jobs that need a look first, when GPUs free up, and what was wasted.

import { getJSON } from "./api.js";
import { h, replace } from "./dom.js";
import {
  BAD_HEALTH, DASH, HEALTH_SEVERITY, HEALTH_STATES, JOB_STATES, fmtClock, fmtDuration, fmtMoney, fmtNum, fmtPercent,
  healthLabel, stateClass,
} from "./format.js";
import { remaining } from "./list.js";
import { state, subscribe } from "./state.js";

const WEEK = 7 * 86400;
const TIMELINE_ROWS = 40;

export function renderAdmin(main) {
  let timer = null;
  let destroyed = false;
  const body = h("div", { class: "admin" });
  replace(main, h("h1", null, "Fleet"), body);
  // money the server adds up over every job (ended ones too): what policies saved this week
  let ledger = null;
  const fetchLedger = () => getJSON(`/api/v1/costs?since=${Math.floor(Date.now() / 1000 - WEEK)}`)
    .then((found) => { ledger = found; schedule(); })
    .catch(() => {});

  function render() {
    if (destroyed) return;
    const now = Date.now() / 1000;
    const jobs = [...state.jobs.values()];
    const running = jobs.filter((j) => j.state === "running");
    const sum = (list, f) => list.reduce((a, j) => a + (f(j) ?? 0), 0);
    const gpus = sum(running, (j) => j.resources && j.resources.gpus);
    const burn = sum(running, (j) => j.cost.rate_per_hour);
    const spent = sum(jobs, (j) => j.cost.spent);
    const weekJobs = jobs.filter((j) => j.times.updated >= now - WEEK);
    const wastedWeek = sum(weekJobs, (j) => j.cost.wasted);
    const byState = Object.fromEntries(JOB_STATES.map((s) => [s, 0]));
    const byHealth = Object.fromEntries(HEALTH_STATES.map((s) => [s, 0]));
    for (const j of jobs) {
      byState[j.state] = (byState[j.state] || 0) + 1;
      byHealth[j.health.state] = (byHealth[j.health.state] || 0) + 1;
    }

    const cards = h("div", { class: "cards", "data-testid": "totals" },
      card("Jobs", jobs.length.toLocaleString("en-US"), "jobs"),
      card("Running", running.length.toLocaleString("en-US"), "running"),
      card("GPUs in use", fmtNum(gpus, 4), "gpus"),
      card("Burn", `${fmtMoney(burn)}/h`, "burn"),
      card("Spent", fmtMoney(spent), "spent"),
      card("Wasted, jobs active this week", fmtMoney(wastedWeek), "wasted"),
      card("Saved by policies, this week", ledger ? fmtMoney(ledger.total.saved) : DASH, "saved"));

    const countTable = (title, counts, known, labels, prefix) => h("table", { class: "small counts", "data-testid": `by-${prefix === "s" ? "state" : "health"}` },
      h("caption", null, title),
      h("tbody", null,
        Object.entries(counts).map(([k, n]) => h("tr", null,
          h("th", { scope: "row" }, h("span", { class: `badge ${stateClass(prefix, k, known)}` }, labels(k))),
          h("td", { class: "num", dataset: { key: k } }, n.toLocaleString("en-US")))),
        h("tr", { class: "total" }, h("th", { scope: "row" }, "total"), h("td", { class: "num" }, jobs.length.toLocaleString("en-US")))));

    // namespaces
    const spaces = new Map();
    for (const j of jobs) {
      let s = spaces.get(j.namespace);
      if (!s) spaces.set(j.namespace, (s = { jobs: 0, running: 0, gpus: 0, burn: 0, spent: 0, wasted: 0, attention: 0 }));
      s.jobs += 1;
      if (j.state === "running") {
        s.running += 1;
        s.gpus += (j.resources && j.resources.gpus) || 0;
        s.burn += j.cost.rate_per_hour || 0;
        if (BAD_HEALTH.has(j.health.state)) s.attention += 1;
      }
      s.spent += j.cost.spent || 0;
      s.wasted += j.cost.wasted || 0;
    }
    const nsRows = [...spaces.entries()].sort((a, b) => b[1].burn - a[1].burn || a[0].localeCompare(b[0]));
    const nsTable = h("table", { class: "data", "data-testid": "namespaces" },
      h("caption", null, "Namespaces"),
      h("thead", null, h("tr", null, ["namespace", "jobs", "running", "GPUs", "$/h", "spent", "wasted", "need a look"].map((c) => h("th", { scope: "col" }, c)))),
      h("tbody", null, nsRows.map(([ns, s]) => h("tr", null,
        h("th", { scope: "row" }, h("a", { href: `#/?namespace=${encodeURIComponent(ns)}` }, ns)),
        h("td", { class: "num" }, s.jobs), h("td", { class: "num" }, s.running), h("td", { class: "num" }, fmtNum(s.gpus, 4)),
        h("td", { class: "num" }, fmtMoney(s.burn)), h("td", { class: "num" }, fmtMoney(s.spent)),
        h("td", { class: "num" }, fmtMoney(s.wasted)), h("td", { class: "num" }, s.attention)))),
      h("tfoot", null, h("tr", null, h("th", { scope: "row" }, "all"),
        h("td", { class: "num" }, jobs.length), h("td", { class: "num" }, running.length), h("td", { class: "num" }, fmtNum(gpus, 4)),
        h("td", { class: "num" }, fmtMoney(burn)), h("td", { class: "num" }, fmtMoney(spent)),
        h("td", { class: "num" }, fmtMoney(sum(jobs, (j) => j.cost.wasted))),
        h("td", { class: "num" }, running.filter((j) => BAD_HEALTH.has(j.health.state)).length))));

    // what needs a look first: running jobs in bad health, worst first, then by money wasted
    const attention = running.filter((j) => BAD_HEALTH.has(j.health.state)).sort((a, b) =>
      (HEALTH_SEVERITY[a.health.state] - HEALTH_SEVERITY[b.health.state]) || ((b.cost.wasted || 0) - (a.cost.wasted || 0)));
    const attentionList = h("table", { class: "data", "data-testid": "attention" },
      h("caption", null, "Needs a look (stalled, not learning, diverging, straggling)"),
      h("thead", null, h("tr", null, ["job", "health", "why", "wasted", "$/h"].map((c) => h("th", { scope: "col" }, c)))),
      h("tbody", null, attention.length
        ? attention.slice(0, 100).map((j) => h("tr", null,
          h("th", { scope: "row" }, h("a", { href: `#/admin?job=${encodeURIComponent(`${j.namespace}/${j.name}`)}` }, `${j.namespace}/${j.name}`)),
          h("td", null, h("span", { class: `badge ${stateClass("h", j.health.state, HEALTH_STATES)}` }, healthLabel(j.health.state))),
          h("td", { class: "why" }, String((j.health.evidence && j.health.evidence.message) || "")),
          h("td", { class: "num" }, fmtMoney(j.cost.wasted)), h("td", { class: "num" }, fmtMoney(j.cost.rate_per_hour))))
        : h("tr", null, h("td", { colspan: 5, class: "muted" }, "Nothing: every running job is healthy or not yet judged."))));

    // when GPUs free up: running jobs by finish time
    const withEta = running.map((j) => ({ j, rest: remaining(j, now) })).filter((x) => x.rest !== null).sort((a, b) => a.rest - b.rest);
    const noEta = running.length - withEta.length;
    const horizon = Math.max(3600, ...withEta.slice(0, TIMELINE_ROWS).map((x) => x.rest));
    const freed = (seconds) => withEta.filter((x) => x.rest <= seconds).reduce((a, x) => a + ((x.j.resources && x.j.resources.gpus) || 0), 0);
    const timeline = h("section", { "aria-labelledby": "a-timeline", "data-testid": "timeline" },
      h("h2", { id: "a-timeline" }, "When do GPUs free up"),
      h("p", null, `GPUs freed within 1 h: ${fmtNum(freed(3600), 4)} · 6 h: ${fmtNum(freed(6 * 3600), 4)} · 24 h: ${fmtNum(freed(86400), 4)}`,
        noEta ? ` · ${noEta} running job${noEta === 1 ? "" : "s"} without an ETA` : ""),
      h("ol", { class: "gantt" }, withEta.slice(0, TIMELINE_ROWS).map(({ j, rest }) => h("li", null,
        h("a", { href: `#/admin?job=${encodeURIComponent(`${j.namespace}/${j.name}`)}`, class: "who" }, `${j.namespace}/${j.name}`),
        h("span", { class: "track" }, h("span", { class: `span ${stateClass("h", j.health.state, HEALTH_STATES)}`, style: { width: `${Math.max(1, (100 * rest) / horizon)}%` } })),
        h("span", { class: "when" }, `${fmtDuration(rest)} · ${fmtClock(now + rest)} · ${fmtNum((j.resources && j.resources.gpus) || 0, 3)} GPU · ${fmtPercent(j.progress.percent)}`)))),
      withEta.length > TIMELINE_ROWS ? h("p", { class: "muted" }, `and ${withEta.length - TIMELINE_ROWS} more`) : null);

    const partial = state.complete ? null : h("p", { class: "notice" }, `These figures cover the ${state.jobs.size.toLocaleString("en-US")} most recently updated jobs of ${state.total.toLocaleString("en-US")}.`);
    replace(body, partial, cards,
      h("div", { class: "two" }, countTable("By state", byState, JOB_STATES, (k) => k, "s"),
        countTable("By health", byHealth, HEALTH_STATES, healthLabel, "h")),
      attentionList, timeline, nsTable,
      h("p", { class: "muted" }, `Wasted: money spent since a job stopped doing useful work (health gone bad). "This week": jobs updated in the last 7 days. ${DASH} means unknown (no GPUs or price given).`));
  }

  function schedule() {
    if (timer) return;
    timer = setTimeout(() => {
      timer = null;
      render();
    }, 1000);
  }

  const unsubscribe = subscribe((kind) => {
    if (kind === "jobs") render();
    else if (kind === "job") schedule();
  });
  render();
  fetchLedger();
  const tick = setInterval(schedule, 5000);
  const ledgerTick = setInterval(fetchLedger, 30000);
  return {
    destroy() {
      destroyed = true;
      unsubscribe();
      clearInterval(tick);
      clearInterval(ledgerTick);
      clearTimeout(timer);
    },
  };
}

function card(label, value, id) {
  return h("div", { class: "card" }, h("span", { class: "label" }, label), h("span", { class: "value", "data-testid": `total-${id}` }, value));
}
