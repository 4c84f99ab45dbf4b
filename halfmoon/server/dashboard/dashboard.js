// halfmoon's dashboard: one page per hash route, every figure and every action one
// admin API call. No framework and no build step: DOM nodes are built with el(),
// never from HTML strings, so a topic or message body can never inject markup.
"use strict";

const REFRESH_MS = 5000;
const PAGE_SIZE = 50;
const session = { canWrite: true, canManageUsers: true, timers: [], lagHistory: new Map(), selected: new Set(),
  resent: new Map() };  // dead letter (topic/queue/offset) -> the id of its resent copy

// -- the admin API -------------------------------------------------------------------

class ApiFailure extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

async function api(method, path, body) {
  const options = { method, headers: {} };
  const credentials = sessionStorage.getItem("halfmoon.credentials");
  if (credentials) options.headers.Authorization = credentials;
  if (body !== undefined) {
    options.headers["Content-Type"] = "application/json";
    options.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, options);
  } catch (err) {
    // A browser aborts the requests in flight when the host's network changes (an address
    // added or removed: net::ERR_NETWORK_CHANGED). A GET changes nothing, so it is tried once
    // more before the page says the broker is unreachable; an action is not repeated.
    try {
      if (method !== "GET") throw err;
      response = await fetch(path, options);
    } catch (again) {
      setConnection(false);
      throw new ApiFailure(0, "UNREACHABLE",
        `the broker is unreachable (${method} ${path} failed: ${again.message})`);
    }
  }
  setConnection(true);
  const text = await response.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (_) { data = null; }
  if (!response.ok) {
    const error = (data && data.error) || {};
    throw new ApiFailure(response.status, error.code || `HTTP_${response.status}`,
      error.message || `${method} ${path} answered ${response.status}`);
  }
  return data;
}

const get = (path) => api("GET", path);
const q = encodeURIComponent;

function setConnection(up) {
  const badge = document.getElementById("connection");
  badge.textContent = up ? "broker reachable" : "broker unreachable";
  badge.className = "connection " + (up ? "ok" : "down");
}

function showError(err) {
  const banner = document.getElementById("banner");
  banner.hidden = false;
  banner.textContent = err.code ? `${err.code}: ${err.message}` : String(err.message || err);
}

function clearError() {
  document.getElementById("banner").hidden = true;
}

// Every action says that it happened: a green line under the header until the next one.
function showDone(text) {
  const done = document.getElementById("done");
  done.textContent = text;
  done.hidden = !text;
}

// Runs an action from a button: errors go to the banner; success is said (``done``, a
// text or a function of the API's answer) and re-renders the page, or goes to the page
// ``next`` names.
async function act(fn, question, next, done) {
  if (question && !window.confirm(question)) return;
  showDone("");
  try {
    const answer = await fn();
    clearError();
    showDone(typeof done === "function" ? done(answer) : done || "done");
    session.keepDone = true;  // the page drawn next still says what was done
    if (next && location.hash !== next) location.hash = next;
    else await route();
  } catch (err) {
    showError(err);
  }
}

// -- DOM helpers -----------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "text") node.textContent = value;
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

// A form control with its label (a placeholder is no label: it vanishes as one types).
function field(text, control) {
  return el("label", {}, `${text} `, control);
}

// Mutating controls exist only for users who may change things.
const writable = (...nodes) => (session.canWrite ? nodes : []);

function table(headers, rows) {
  return el("table", {},
    el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))),
    el("tbody", {}, rows.map((cells) => el("tr", {}, cells.map((c) => el("td", {}, c))))));
}

function card(label, value, id) {
  return el("div", { class: "card", id }, el("div", { class: "value" }, value),
    el("div", { class: "label" }, label));
}

// Times in the browser's zone, with the zone said: "2026-12-01 23:40:12 GMT+1".
const TIME_FORMAT = new Intl.DateTimeFormat("sv-SE", { year: "numeric", month: "2-digit", day: "2-digit",
  hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false, timeZoneName: "short" });
const fmtTime = (ms) => (ms ? TIME_FORMAT.format(new Date(ms)) : "");
// Message fields that hold epoch milliseconds (born_timestamp, store_timestamp, ...).
const isTimeField = (name, value) => typeof value === "number" && value > 1e11 &&
  /(_timestamp|_time_ms|_at_ms|_ms_at|^time_ms)$/.test(name);
const fmtAge = (ms) => (ms < 60000 ? `${Math.round(ms / 1000)} s` :
  ms < 3600000 ? `${Math.round(ms / 60000)} min` : `${(ms / 3600000).toFixed(1)} h`);
const fmtBytes = (n) => (n > 1 << 30 ? `${(n / (1 << 30)).toFixed(1)} GiB` :
  n > 1 << 20 ? `${(n / (1 << 20)).toFixed(1)} MiB` : `${Math.round(n / 1024)} KiB`);

function formValue(form, name) {
  return form.elements[name].value.trim();
}

// A per-minute chart of the last hour: two series, drawn as SVG polylines.
// chart(): charts.js.

function sumSeries(rows) {
  const total = new Array(60).fill(0);
  for (const row of rows) (row.last_hour || []).forEach((v, i) => { total[i] += v; });
  return total;
}

// -- routing and live refresh -------------------------------------------------------------

// How a page refreshes: true, all of it; PARTS, only its elements marked data-live (each with
// an id), leaving its forms alone; false, only after an action.
const PARTS = "parts";
// Each page's module adds its own: PAGES.name = [render, live]; TITLES.name = "Heading".
const PAGES = {};
const TITLES = {};

let renderSerial = 0;

async function route() {
  const [name, query] = (location.hash.slice(2) || "overview").split("?");
  const [render, live] = PAGES[name] || PAGES.overview;
  const params = new URLSearchParams(query || "");
  for (const timer of session.timers) clearInterval(timer);
  session.timers = [];
  for (const link of document.querySelectorAll("#nav a")) {
    link.classList.toggle("active", link.getAttribute("href").slice(2).split("?")[0] === name.replace(/^(topic|group|message|user)$/, "$1s").replace(/^backlog$/, "groups"));
  }
  const root = document.getElementById("page");
  const serial = ++renderSerial;
  const draw = async (refresh) => {
    const next = el("div", {});
    try {
      await render(next, params);
      if (serial !== renderSerial) return;  // the user moved on meanwhile
      const parts = [...next.querySelectorAll("[data-live]")];
      const shown = parts.map((part) => document.getElementById(part.id));
      if (refresh && live === PARTS && root.dataset.loaded === name && shown.every(Boolean)) {
        parts.forEach((part, i) => shown[i].replaceWith(part));
      } else {
        root.replaceChildren(...next.childNodes);
      }
      root.dataset.loaded = name;
      root.dataset.drawn = String(Number(root.dataset.drawn || 0) + 1);
      clearError();
    } catch (err) {
      if (serial !== renderSerial) return;
      showError(err);
      if (!refresh) {
        // Not the previous page's content under this page's name: say what failed.
        root.replaceChildren(el("h2", {}, TITLES[name] || name),
          el("p", { class: "muted", id: "load-failed" }, `this page could not be loaded: ${err.code ? `${err.code}: ` : ""}${err.message}`));
        root.dataset.loaded = name;
      }
    }
  };
  if (!session.keepDone) showDone("");
  session.keepDone = false;
  await draw(false);
  // Live pages redraw every few seconds. Pages with forms redraw only their figures (the
  // elements marked data-live), so a refresh never wipes what the user is typing.
  if (live) session.timers.push(setInterval(() => draw(true), REFRESH_MS));
}

// -- login --------------------------------------------------------------------------------

function showUser(who) {
  const slot = document.getElementById("user");
  if (!who.auth_enabled) { slot.replaceChildren(); return; }
  slot.replaceChildren(`${who.access_key}${who.can_write ? "" : " (read-only)"} `,
    el("a", { href: "#/overview", id: "logout", onclick: () => {
      sessionStorage.removeItem("halfmoon.credentials");
      location.reload();
    } }, "log out"));
}

function loginPage(reason) {
  const root = document.getElementById("page");
  root.dataset.loaded = "login";
  root.replaceChildren(el("h2", {}, "Log in"),
    el("p", { class: "muted", id: "login-reason" }, reason),
    el("form", { class: "inline", id: "login", onsubmit: (e) => {
      e.preventDefault();
      const pair = `${formValue(e.target, "access_key")}:${e.target.elements.secret_key.value}`;
      sessionStorage.setItem("halfmoon.credentials",
        "Basic " + btoa(String.fromCharCode(...new TextEncoder().encode(pair))));
      start();
    } },
    el("input", { name: "access_key", placeholder: "access key", required: true, autocomplete: "username" }),
    el("input", { name: "secret_key", type: "password", placeholder: "secret key", required: true, autocomplete: "current-password" }),
    el("button", { type: "submit" }, "log in")));
}

// Asks the API who we are first: with authentication on and no valid credentials the
// page is a login form; a read-only user's pages have no mutating controls.
async function start() {
  let who;
  try {
    who = await get("/v1/whoami");
  } catch (err) {
    showError(err);
    return;
  }
  if (who.auth_enabled && !who.authenticated) {
    sessionStorage.removeItem("halfmoon.credentials");
    for (const timer of session.timers) clearInterval(timer);
    loginPage(who.reason);
    return;
  }
  session.canWrite = who.can_write;
  // /v1/users and /v1/acls are for super users only (without authentication, anyone).
  session.canManageUsers = who.auth_enabled ? who.super : who.can_write;
  showUser(who);
  clearError();
  await route();
}

window.addEventListener("hashchange", () => { if (document.getElementById("page").dataset.loaded !== "login") route(); });
window.addEventListener("DOMContentLoaded", start);
