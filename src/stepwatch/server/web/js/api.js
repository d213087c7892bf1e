// The HTTP API as the dashboard uses it. Errors carry the server's Status message.

export class ApiError extends Error {
  constructor(message, code, network = false) {
    super(message);
    this.code = code;
    this.network = network;
  }
}

const networkListeners = new Set();

/** Called with (ok: boolean) after each request: the page shows a banner while the server is away. */
export function onNetwork(fn) {
  networkListeners.add(fn);
}

function tell(ok) {
  for (const fn of networkListeners) fn(ok);
}

// ---------------------------------------------------------------------------------------- the token
// With authentication on (docs/auth.md), the API token is asked for once per tab and kept in
// sessionStorage (gone with the tab); every fetch sends it as a bearer token. EventSource cannot send
// headers, so the live stream gets it from a cookie the server reads on GET /api/v1/events only.

const TOKEN_KEY = "stepwatch.token";
const authListeners = new Set();

/** Called with the refusal's message when the server wants (another) token: the page asks for one. */
export function onAuthNeeded(fn) {
  authListeners.add(fn);
}

export function authNeeded(message) {
  for (const fn of authListeners) fn(message);
}

export function token() {
  try {
    return sessionStorage.getItem(TOKEN_KEY) || "";
  } catch {
    return "";
  }
}

export function setToken(value) {
  const secure = location.protocol === "https:" ? "; Secure" : "";
  if (value) {
    sessionStorage.setItem(TOKEN_KEY, value);
    document.cookie = `stepwatch_token=${encodeURIComponent(value)}; path=/api/v1/events; SameSite=Strict${secure}`;
  } else {
    sessionStorage.removeItem(TOKEN_KEY);
    document.cookie = `stepwatch_token=; path=/api/v1/events; max-age=0; SameSite=Strict${secure}`;
  }
}

async function request(method, path, body) {
  let response;
  const headers = body === undefined ? {} : { "Content-Type": "application/json" };
  const secret = token();
  if (secret) headers.Authorization = `Bearer ${secret}`;
  try {
    response = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (err) {
    tell(false);
    throw new ApiError(`the server does not answer (${err.message})`, 0, true);
  }
  tell(true);
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = null;
  }
  if (!response.ok) {
    const message = data && typeof data.message === "string" ? data.message : `${response.status} ${response.statusText}`;
    if (response.status === 401) authNeeded(message);
    throw new ApiError(message, response.status);
  }
  return data;
}

export const getJSON = (path) => request("GET", path);
export const postJSON = (path, body) => request("POST", path, body);
export const putJSON = (path, body) => request("PUT", path, body);

export function jobPath(namespace, name) {
  return `/api/v1/namespaces/${encodeURIComponent(namespace)}/jobs/${encodeURIComponent(name)}`;
}

export function historyPath(namespace, name, metrics, maxPoints) {
  const q = new URLSearchParams({ max_points: String(maxPoints) });
  if (metrics && metrics.length) q.set("metrics", metrics.join(","));
  return `${jobPath(namespace, name)}/history?${q}`;
}

/** A job's key in the page: "namespace/name" (both Kubernetes names, so "/" cannot be part of either). */
export function keyOf(job) {
  return `${job.namespace}/${job.name}`;
}

export function splitKey(key) {
  const i = key.indexOf("/");
  return [key.slice(0, i), key.slice(i + 1)];
}
