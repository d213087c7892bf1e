// The dashboard's entry: routes (in the URL fragment), the live stream, and the connection banner.
//   #/                      job list        (?job=namespace/name opens the side panel on any view)
//   #/compare/ns/a,ns/b     compare runs
//   #/admin                 the fleet

import { renderAdmin } from "./admin.js";
import { loadPlotly } from "./charts.js";
import { renderCompare } from "./compare.js";
import { presetFilter, renderJobs } from "./list.js";
import { closePanel, openPanel } from "./panel.js";
import { getJSON, onAuthNeeded, setToken, token } from "./api.js";
import { connect, disconnect, loadJobs, state, subscribe } from "./state.js";

const main = document.getElementById("main");
const banner = document.getElementById("banner");
const live = document.getElementById("live");
let view = null;
let viewId = null;

function parseHash() {
  const raw = decodeURIComponent(location.hash.slice(1)) || "/";
  const at = raw.indexOf("?");
  const path = at < 0 ? raw : raw.slice(0, at);
  return { path, params: new URLSearchParams(at < 0 ? "" : location.hash.slice(location.hash.indexOf("?") + 1)) };
}

function route() {
  const { path, params } = parseHash();
  let name = "jobs";
  let arg = "";
  if (path.startsWith("/compare")) {
    name = "compare";
    arg = path.slice("/compare".length).replace(/^\//, "");
  } else if (path.startsWith("/admin")) name = "admin";
  if (name === "jobs" && params.get("namespace")) presetFilter({ namespace: params.get("namespace") });
  const id = `${name}:${arg}:${params.get("namespace") || ""}`;
  if (id !== viewId) {
    if (view) view.destroy();
    viewId = id;
    if (name === "compare") view = renderCompare(main, arg.split(",").filter(Boolean));
    else if (name === "admin") view = renderAdmin(main);
    else view = renderJobs(main);
    document.title = `stepwatch · ${name === "jobs" ? "jobs" : name}`;
  }
  for (const link of document.querySelectorAll("nav a")) {
    if (link.dataset.view === name) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  const job = params.get("job");
  if (job) {
    openPanel(job, {
      onClose: () => {
        params.delete("job");
        const rest = params.toString();
        location.hash = `#${path}${rest ? `?${rest}` : ""}`;
      },
    });
  } else closePanel();
}

function showLive(value) {
  live.textContent = value === "live" ? "● live" : value === "reconnecting" ? "○ reconnecting…" : "connecting…";
  live.className = `live ${value}`;
  if (value === "reconnecting") {
    banner.textContent = `The server at ${location.host} does not answer. Retrying every few seconds; what you see may be out of date.`;
    banner.hidden = false;
  } else if (value === "live") banner.hidden = true;
}

subscribe((kind, detail) => {
  if (kind === "live") showLive(detail);
});

// ------------------------------------------------------------------------------ who is looking

const login = document.getElementById("login");
const loginToken = document.getElementById("login-token");
const loginError = document.getElementById("login-error");
const who = document.getElementById("who");
const signout = document.getElementById("signout");
let waitingForToken = null;

/** Who the server takes this tab for; with authentication on and no (valid) token, ask for one first. */
async function identify() {
  for (;;) {
    try {
      const me = await getJSON("/api/v1/whoami");
      if (me.auth !== "none") {
        who.textContent = me.who;
        who.hidden = false;
        signout.hidden = !token();
      }
      return me;
    } catch (err) {
      if (err.code !== 401) {
        if (!err.network) return null; // an older server: no whoami, no authentication
        await new Promise((r) => setTimeout(r, 1000));
        continue;
      }
      await askForToken(token() ? err.message : "");
    }
  }
}

function askForToken(message) {
  if (!waitingForToken) {
    waitingForToken = new Promise((resolve) => {
      loginError.textContent = message || "";
      loginToken.value = "";
      login.addEventListener(
        "close",
        () => {
          setToken(loginToken.value.trim());
          waitingForToken = null;
          resolve();
        },
        { once: true },
      );
      login.showModal();
    });
  }
  return waitingForToken;
}

login.addEventListener("cancel", (e) => e.preventDefault()); // no way around it: nothing can be read without

onAuthNeeded((message) => {
  if (waitingForToken) return;
  disconnect();
  askForToken(message).then(async () => {
    await identify();
    connect();
    loadJobs().catch(() => {});
  });
});

signout.addEventListener("click", () => {
  setToken("");
  location.reload();
});

async function start() {
  await identify();
  connect(); // first: what changes while the list loads is not lost
  for (let attempt = 0; ; attempt++) {
    try {
      await loadJobs();
      // the charting library (4.8 MB, 1.4 MB gzipped) loads once the list is up, before a chart is asked for
      const idle = window.requestIdleCallback || ((fn) => setTimeout(fn, 300));
      idle(() => loadPlotly().catch(() => {}));
      break;
    } catch (err) {
      if (!err.network) {
        banner.textContent = `The job list could not be read: ${err.message}`;
        banner.hidden = false;
      }
      await new Promise((r) => setTimeout(r, Math.min(5000, 500 * 2 ** attempt)));
    }
  }
}

window.addEventListener("hashchange", route);
route();
start();
window.stepwatch = { state }; // for the browser tests and curious users
