// Talking to amqpd's HTTP API (RabbitMQ's paths and JSON shapes) from the page.
//
// Authentication is the HttpOnly session cookie set by POST /api/login: the page never
// holds a password or a token. Every request carries X-Requested-With, which the server
// demands of cookie-authenticated writes (a cross-site form cannot send it) and which
// keeps 401s free of the Basic-auth challenge that would pop up the browser's dialog.
//
// The connection watcher: a request that fails at the network level marks the broker
// unreachable; the app keeps polling, and the first answer after that says so
// ("reconnected"), so a broker restart under an open page is shown, never fatal.

export class ApiError extends Error {
  constructor(status, error, reason, path) {
    super(reason || error || `HTTP ${status}`);
    this.status = status;
    this.error = error;
    this.reason = reason;
    this.path = path;
  }

  // what a person reads: the API's own reason, and what to do about common statuses
  describe() {
    const hint = {
      401: "You are not allowed to do this (or your session ended).",
      403: "Access refused by the broker's permissions.",
      404: "It does not exist (any more?).",
      405: "This operation is not supported here.",
      409: "The object is in use.",
    }[this.status] || "";
    // a refused login says exactly why (wrong password, localhost only): no general hint
    const what = this.reason || this.error || "request failed";
    const extra = hint && this.path !== "/api/login" ? ` — ${hint}` : "";
    return `${what}${extra} (HTTP ${this.status})`;
  }
}

export class NetworkError extends Error {}

const listeners = { down: [], up: [], unauthorised: [] };
let downSince = null;

export function on(event, fn) { listeners[event].push(fn); }

function emit(event, arg) { for (const fn of listeners[event]) fn(arg); }

export function seg(name) { return encodeURIComponent(name); }

export async function request(method, path, body, { raw = false, quiet401 = false } = {}) {
  const init = {
    method,
    credentials: "same-origin",
    headers: { "X-Requested-With": "amqpd-ui", Accept: "application/json" },
    cache: "no-store",
  };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = typeof body === "string" ? body : JSON.stringify(body);
  }
  let resp;
  try {
    resp = await fetch(path, init);
  } catch (exc) {
    if (downSince === null) { downSince = Date.now(); emit("down", exc); }
    throw new NetworkError(`the broker is unreachable (${exc.message})`);
  }
  if (downSince !== null) {
    const seconds = Math.round((Date.now() - downSince) / 1000);
    downSince = null;
    emit("up", seconds);
  }
  const text = await resp.text();
  if (!resp.ok) {
    let error = "", reason = text.slice(0, 500);
    try { const j = JSON.parse(text); error = j.error || ""; reason = j.reason || reason; } catch (_) { /* not JSON */ }
    // "not_authorized" is a failed login or an ended session; "not_authorised" (RabbitMQ's
    // spelling for a missing tag or vhost access) is a refusal the page just reports
    if (resp.status === 401 && error === "not_authorized" && !quiet401 && path !== "/api/login") emit("unauthorised", reason);
    throw new ApiError(resp.status, error, reason, path);
  }
  if (raw) return text;
  return text ? JSON.parse(text) : null;
}

export const get = (path, opts) => request("GET", path, undefined, opts);
export const put = (path, body) => request("PUT", path, body ?? {});
export const post = (path, body) => request("POST", path, body ?? {});
export const del = (path) => request("DELETE", path);

export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== "") q.set(k, v);
  const s = q.toString();
  return s ? `?${s}` : "";
}
