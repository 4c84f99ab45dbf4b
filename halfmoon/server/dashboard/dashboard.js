// halfmoon's dashboard: one page per hash route, every figure and every action one
// admin API call. No framework and no build step: DOM nodes are built with el(),
// never from HTML strings, so a topic or message body can never inject markup.
"use strict";

const REFRESH_MS = 5000;
const PAGE_SIZE = 50;
const session = { canWrite: true, canManageUsers: true, timers: [], lagHistory: new Map(), selected: new Set() };

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
    setConnection(false);
    throw new ApiFailure(0, "UNREACHABLE",
      `the broker is unreachable (${method} ${path} failed: ${err.message})`);
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

// Runs an action from a button: errors go to the banner; success re-renders the page,
// or goes to the page ``next`` names.
async function act(fn, question, next) {
  if (question && !window.confirm(question)) return;
  try {
    await fn();
    clearError();
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

const fmtTime = (ms) => (ms ? new Date(ms).toISOString().replace("T", " ").slice(0, 19) : "");
const fmtAge = (ms) => (ms < 60000 ? `${Math.round(ms / 1000)} s` :
  ms < 3600000 ? `${Math.round(ms / 60000)} min` : `${(ms / 3600000).toFixed(1)} h`);
const fmtBytes = (n) => (n > 1 << 30 ? `${(n / (1 << 30)).toFixed(1)} GiB` :
  n > 1 << 20 ? `${(n / (1 << 20)).toFixed(1)} MiB` : `${Math.round(n / 1024)} KiB`);

function formValue(form, name) {
  return form.elements[name].value.trim();
}

// A per-minute chart of the last hour: two series, drawn as SVG polylines.
function chart(inSeries, outSeries) {
  const width = 600, height = 100;
  const peak = Math.max(1, ...inSeries, ...outSeries);
  const line = (series) => series.map((v, i) =>
    `${(i * width) / Math.max(series.length - 1, 1)},${height - (v / peak) * height}`).join(" ");
  const svgNs = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(svgNs, "svg");
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("class", "chart");
  svg.setAttribute("preserveAspectRatio", "none");
  for (const [series, cls] of [[inSeries, "in"], [outSeries, "out"]]) {
    const poly = document.createElementNS(svgNs, "polyline");
    poly.setAttribute("points", line(series));
    poly.setAttribute("class", cls);
    svg.append(poly);
  }
  return el("div", {}, svg, el("div", { class: "muted" },
    `messages per minute, last 60 minutes (peak ${peak}); blue: in, green: out`));
}

function sumSeries(rows) {
  const total = new Array(60).fill(0);
  for (const row of rows) (row.last_hour || []).forEach((v, i) => { total[i] += v; });
  return total;
}

// -- pages -----------------------------------------------------------------------------

// A broker's name: "broker" from a single broker, "name" from a cluster's member list.
const brokerName = (b) => b.broker || b.name;

// In a cluster (a proxy's member list from etcd): a broker whose lease is gone holds queues
// nobody can reach; one this proxy cannot reach is down or cut off, even while its lease
// still runs; one late renewing its lease is stopping, paused or cut off from etcd.
function brokerWarnings(brokers) {
  const warnings = [];
  for (const b of brokers) {
    const role = b.role === "replica" ? "replica " : "";
    const queues = b.queues ? ` (${b.queues} queue(s) unavailable)` : "";
    if (b.state === "gone" || b.state === "expired") {
      warnings.push(`${role}broker ${brokerName(b)} is down: its lease is gone${queues}`);
    } else if (b.reachable === false) {
      warnings.push(`${role}broker ${brokerName(b)} is unreachable from this proxy${queues}`);
    } else if (b.state === "late") {
      warnings.push(`${role}broker ${brokerName(b)} is late renewing its lease ` +
        `(it expires in ${b.expires_in_s} s)`);
    }
  }
  return warnings;
}

// Replicated broker groups: a replica of the in-sync set whose lease is gone is down; fewer
// in-sync replicas than the group's minimum means sync sends are refused; a group without a
// master takes no sends; a live replica outside the set is catching up.
function groupWarnings(groups) {
  const warnings = [];
  for (const g of groups) {
    const live = new Set(g.members);
    const isr = g.isr || [];
    for (const name of isr) {
      if (!live.has(name)) warnings.push(`replica ${name} of broker group ${g.group} is down: its lease is gone`);
    }
    if (g.min_insync_replicas !== null && g.min_insync_replicas !== undefined && isr.length < g.min_insync_replicas) {
      warnings.push(`broker group ${g.group} has ${isr.length} in-sync replica(s), fewer than its minimum ` +
        `${g.min_insync_replicas}${g.mode === "sync" ? ": sync sends are refused" : ""}`);
    }
    if (!g.master) warnings.push(`broker group ${g.group} has no master`);
    for (const name of g.members) {
      if (name !== g.master && g.min_insync_replicas !== undefined && !isr.includes(name)) {
        warnings.push(`replica ${name} of broker group ${g.group} is not in sync (catching up or lagging)`);
      }
    }
  }
  return warnings;
}

// Each replica's lag behind its master, in bytes of commit log, as the master reports it.
function replicationLag(group) {
  const replicas = Object.entries(group.replicas || {}).sort(([a], [b]) => a.localeCompare(b));
  return replicas.map(([name, p]) => `${name}: ${fmtBytes(p.lag_bytes || 0)}`).join(", ");
}

function brokerState(b) {
  if (b.state === "gone" || b.state === "expired" || b.reachable === false) return ["down", false];
  if (b.state === "late") return ["late", false];
  return [b.state || "up", true];
}

async function overviewPage(root) {
  const [status, cluster, stats, pending, config, dlq] = await Promise.all([
    get("/v1/broker/status"), get("/v1/cluster"), get("/v1/statistics"),
    get("/v1/transactions?limit=1000"), get("/v1/config"), get("/v1/dead-letters")]);
  const txn = config.transaction;
  const window = txn.timeout_ms + txn.check_interval_ms;
  const warnings = [];
  // Parked transactions have their own warning: these are the ones still under checks.
  const stale = pending.transactions.filter((t) => t.state !== "parked" && t.age_ms > window);
  if (stale.length) {
    warnings.push(`${stale.length} half message(s) older than the check window ` +
      `(${fmtAge(window)}): their producers do not answer checks`);
  }
  const lagByGroup = new Map();
  for (const row of stats.rows.filter((r) => r.group)) {
    lagByGroup.set(row.group, (lagByGroup.get(row.group) || 0) + (row.lag || 0));
  }
  for (const [group, lag] of lagByGroup) {
    const history = session.lagHistory.get(group) || [];
    history.push(lag);
    if (history.length > 4) history.shift();
    session.lagHistory.set(group, history);
    const growing = history.length >= 3 && history.every((v, i) => i === 0 || v > history[i - 1]);
    if (growing) warnings.push(`group ${group}: lag growing (${history.join(" → ")})`);
  }
  warnings.push(...brokerWarnings(cluster.brokers), ...groupWarnings(cluster.broker_groups || []));
  if (status.parked_transactions) warnings.push(`${status.parked_transactions} parked transaction(s) need an operator`);
  const inRows = stats.rows.filter((r) => !r.group);
  const outRows = stats.rows.filter((r) => r.group);
  root.replaceChildren(
    el("h2", {}, "Overview"),
    el("div", { class: "cards" },
      card("messages in / s", status.tps_in.toFixed(2), "tps-in"),
      card("messages out / s", status.tps_out.toFixed(2), "tps-out"),
      card("topics", status.topics), card("groups", status.groups),
      card("disk used by the store", fmtBytes(status.disk_bytes), "disk"),
      card("disk used (volume)", `${Math.round((status.disk_used_ratio || 0) * 100)} %`, "volume"),
      card("pending transactions", status.pending_transactions, "pending"),
      card("parked transactions", status.parked_transactions, "parked"),
      card("dead letters", dlq.total, "dead-letters"),
      card("connected clients", status.clients)),
    el("section", { id: "warnings" }, el("h2", {}, "Warnings"),
      warnings.length ? el("ul", {}, warnings.map((w) => el("li", { class: "warning" }, w)))
        : el("p", { class: "muted" }, "none")),
    el("section", {}, el("h2", {}, "Traffic"), chart(sumSeries(inRows), sumSeries(outRows))),
    // In a cluster, the proxies too (each the endpoint clients reach; this page is served by one).
    ...((cluster.proxies || []).length ? [el("section", { id: "proxies" }, el("h2", {}, "Proxies"),
      table(["proxy", "state", "endpoint", "workers", "uptime"],
        cluster.proxies.map((p) => [p.name,
          el("span", { class: p.state === "live" ? "state-ok" : "state-down" }, p.state || ""),
          p.endpoint || "", p.workers ?? 1, p.uptime_ms ? fmtAge(p.uptime_ms) : ""])))] : []),
    el("section", {}, el("h2", {}, "Brokers"),
      table(["broker", "role", "state", "gRPC", "admin", "version", "uptime", "in/s", "out/s"],
        cluster.brokers.map((b) => [brokerName(b), b.role || "",
          el("span", { class: brokerState(b)[1] ? "state-ok" : "state-down" }, brokerState(b)[0]),
          b.grpc || b.endpoint || "", b.admin || "", b.version || "", b.uptime_ms ? fmtAge(b.uptime_ms) : "",
          (b.tps_in || 0).toFixed(2), (b.tps_out || 0).toFixed(2)]))),
    ...((cluster.broker_groups || []).length ? [el("section", { id: "broker-groups" }, el("h2", {}, "Broker groups"),
      table(["group", "master", "epoch", "live members", "in-sync replicas", "minimum", "mode", "replication lag"],
        cluster.broker_groups.map((g) => [g.group, g.master || "", g.epoch ?? "", g.members.join(", "),
          (g.isr || []).join(", "), g.min_insync_replicas ?? "", g.mode || "", replicationLag(g)])))] : []));
}

function pager(total, offset, go) {
  return el("div", { class: "pager" },
    el("button", { onclick: () => go(Math.max(0, offset - PAGE_SIZE)), disabled: offset === 0 }, "previous"),
    el("span", { class: "muted" },
      total ? `${offset + 1}–${Math.min(total, offset + PAGE_SIZE)} of ${total}` : "none"),
    el("button", { onclick: () => go(offset + PAGE_SIZE), disabled: offset + PAGE_SIZE >= total }, "next"));
}

async function topicsPage(root, params) {
  const search = params.get("search") || "";
  const offset = Number(params.get("offset") || 0);
  const [found, stats] = await Promise.all([
    get(`/v1/topics?search=${q(search)}&offset=${offset}&limit=${PAGE_SIZE}`), get("/v1/statistics?last_hour=false")]);
  // Rates and backlog per topic from one statistics answer: messages in per second,
  // and the lag of the groups that consumed the topic in the last 24 h.
  const rate = new Map(), backlog = new Map();
  for (const row of stats.rows) {
    if (!row.group) rate.set(row.topic, row.per_second);
    else backlog.set(row.topic, (backlog.get(row.topic) || 0) + (row.lag || 0));
  }
  const go = (o, s = search) => { location.hash = `#/topics?search=${q(s)}&offset=${o}`; };
  const searchForm = el("form", { class: "inline", onsubmit: (e) => { e.preventDefault(); go(0, formValue(e.target, "search")); } },
    el("input", { name: "search", placeholder: "search topics", value: search }),
    el("button", { type: "submit" }, "search"));
  const createForm = el("form", { class: "inline", id: "create-topic", onsubmit: (e) => {
    e.preventDefault();
    const f = e.target;
    const name = formValue(f, "name");
    act(() => api("POST", "/v1/topics", { name, message_type: formValue(f, "message_type"),
      queue_count: Number(formValue(f, "queue_count")) }),
    `Create ${formValue(f, "message_type")} topic ${name} with ${formValue(f, "queue_count")} queue(s)?`,
    `#/topics?search=${q(name)}&offset=0`);
  } },
  el("input", { name: "name", placeholder: "new topic name", required: true }),
  el("select", { name: "message_type" }, ["normal", "fifo", "delay", "transaction", "priority", "lite"].map((t) => el("option", {}, t))),
  el("input", { name: "queue_count", type: "number", min: 1, value: 8, style: "width:5em" }),
  el("button", { type: "submit" }, "create topic"));
  root.replaceChildren(el("h2", {}, "Topics"), searchForm, ...writable(createForm),
    el("div", { id: "topic-list", "data-live": true }, pager(found.total, offset, go),
    table(["name", "type", "queues", "perm", "in/s", "backlog", "created", ""], found.topics.map((t) => [
      el("a", { href: `#/topic?name=${q(t.name)}` }, t.name), t.message_type, t.queue_count,
      t.perm, (rate.get(t.name) || 0).toFixed(2), backlog.has(t.name) ? backlog.get(t.name) : "",
      fmtTime(t.created_ms),
      writable(el("button", { class: "danger", onclick: () => act(
        () => api("DELETE", `/v1/topics/${q(t.name)}`), `Delete topic ${t.name} and its messages?`) }, "delete"))]))));
}

async function topicPage(root, params) {
  const name = params.get("name");
  const [topic, status, route] = await Promise.all([get(`/v1/topics/${q(name)}`),
    get(`/v1/topics/${q(name)}/status`), get(`/v1/topics/${q(name)}/route`)]);
  const updateForm = el("form", { class: "inline", id: "update-topic", onsubmit: (e) => {
    e.preventDefault();
    act(() => api("PATCH", `/v1/topics/${q(name)}`, { queue_count: Number(formValue(e.target, "queue_count")),
      perm: formValue(e.target, "perm") }), `Change topic ${name}?`);
  } }, "queues", el("input", { name: "queue_count", type: "number", min: 1, value: topic.queue_count, style: "width:5em" }),
  "perm", el("select", { name: "perm" }, ["rw", "r", "w"].map((p) => el("option", { selected: p === topic.perm }, p))),
  el("button", { type: "submit" }, "update"));
  const result = el("div", { id: "send-result", class: "muted" });
  const sendForm = el("form", { class: "inline", id: "send-test", onsubmit: async (e) => {
    e.preventDefault();
    const f = e.target;
    const body = { body: f.elements.body.value };
    if (formValue(f, "tag")) body.tag = formValue(f, "tag");
    if (formValue(f, "key")) body.keys = [formValue(f, "key")];
    try {
      const sent = await api("POST", `/v1/topics/${q(name)}/messages`, body);
      result.textContent = `sent ${sent.message_id} to queue ${sent.queue_id} at offset ${sent.queue_offset}`;
      clearError();
    } catch (err) { showError(err); }
  } }, el("input", { name: "body", placeholder: "body", required: true }),
  el("input", { name: "tag", placeholder: "tag" }), el("input", { name: "key", placeholder: "key" }),
  el("button", { type: "submit" }, "send test message"));
  root.replaceChildren(el("h2", {}, `Topic ${name}`),
    el("p", {}, `type ${topic.message_type}, ${topic.queue_count} queues, perm ${topic.perm}`),
    ...writable(el("section", {}, el("h2", {}, "Change"), updateForm),
      el("section", {}, el("h2", {}, "Send a test message"), sendForm, result)),
    el("section", { id: "queues", "data-live": true }, el("h2", {}, "Queues"),
      table(["queue", "min offset", "max offset", "messages"],
        status.queues.map((x) => [x.queue_id, x.min_offset, x.max_offset, x.max_offset - x.min_offset]))),
    el("section", { id: "route", "data-live": true }, el("h2", {}, "Route"), el("pre", {}, JSON.stringify(route, null, 2))));
}

async function groupsPage(root, params) {
  const search = params.get("search") || "";
  const offset = Number(params.get("offset") || 0);
  const [found, stats, dead] = await Promise.all([
    get(`/v1/groups?search=${q(search)}&offset=${offset}&limit=${PAGE_SIZE}`), get("/v1/statistics?last_hour=false"),
    get("/v1/dead-letters")]);
  const deadLetters = new Map(dead.groups.map((g) => [g.group, g.messages]));
  const lag = new Map(), retrying = new Map();
  for (const row of stats.rows.filter((r) => r.group)) {
    lag.set(row.group, (lag.get(row.group) || 0) + row.lag);
    retrying.set(row.group, (retrying.get(row.group) || 0) + (row.retrying || 0));
  }
  const go = (o, s = search) => { location.hash = `#/groups?search=${q(s)}&offset=${o}`; };
  root.replaceChildren(el("h2", {}, "Consumer groups"),
    el("form", { class: "inline", onsubmit: (e) => { e.preventDefault(); go(0, formValue(e.target, "search")); } },
      el("input", { name: "search", placeholder: "search groups", value: search }),
      el("button", { type: "submit" }, "search")),
    el("div", { id: "group-list", "data-live": true }, pager(found.total, offset, go),
    table(["name", "fifo", "max attempts", "lag (consumed in 24 h)", "dead letters", "consume from", "retrying"], found.groups.map((g) => [
      el("a", { href: `#/group?name=${q(g.name)}` }, g.name), g.fifo ? "yes" : "no",
      g.max_delivery_attempts, lag.has(g.name) ? lag.get(g.name) : "", deadLetters.get(g.name) || 0,
      g.consume_from, retrying.has(g.name) ? retrying.get(g.name) : ""]))));
}

async function groupPage(root, params) {
  const name = params.get("name");
  const [group, progress, clients] = await Promise.all([get(`/v1/groups/${q(name)}`),
    get(`/v1/groups/${q(name)}/progress`), get(`/v1/groups/${q(name)}/clients`)]);
  const dlqTopic = `%DLQ%${name}`;
  // The dead-letter topic exists once the group gave up on a message: look before reading.
  const dlqFound = await get(`/v1/topics?search=${q(dlqTopic)}&limit=1000`);
  const [letters, deadLetters] = dlqFound.topics.some((t) => t.name === dlqTopic)
    ? await Promise.all([get(`/v1/topics/${q(dlqTopic)}/scan?limit=50`).then((r) => r.messages),
      get(`/v1/topics/${q(dlqTopic)}/status`).then((r) =>
        r.queues.reduce((n, x) => n + x.max_offset - x.min_offset, 0))])
    : [[], 0];
  const topics = [...new Set(progress.queues.map((x) => x.topic))];
  const resetForm = el("form", { class: "inline", id: "reset-offset", onsubmit: (e) => {
    e.preventDefault();
    const f = e.target;
    const when = Date.parse(formValue(f, "time"));
    if (Number.isNaN(when)) { showError(new Error("give a time such as 2026-01-31T12:00:00Z")); return; }
    act(() => api("POST", `/v1/groups/${q(name)}/reset-offset`, { topic: formValue(f, "topic"), timestamp_ms: when }),
      `Move group ${name}'s offsets on ${formValue(f, "topic")} to ${formValue(f, "time")}?`);
  } }, "topic", el("select", { name: "topic" }, topics.map((t) => el("option", {}, t))),
  "time", el("input", { name: "time", value: new Date().toISOString().slice(0, 19) + "Z" }),
  el("button", { type: "submit" }, "reset offset"));
  const inflight = progress.queues.reduce((s, x) => s + x.inflight, 0);
  const retrying = progress.queues.reduce((s, x) => s + (x.retrying || 0), 0);
  root.replaceChildren(el("h2", {}, `Consumer group ${name}`),
    el("p", { id: "group-summary", "data-live": true }, `fifo ${group.fifo ? "yes" : "no"}, at most ${group.max_delivery_attempts} deliveries, ` +
      `${inflight} in flight (delivered, awaiting ack or retry), ${retrying} of them being retried ` +
      `(delivered more than once), ${deadLetters} dead letter(s)` +
      (deadLetters > letters.length ? ` (the first ${letters.length} below)` : "")),
    el("section", { id: "lag", "data-live": true }, el("h2", {}, "Lag per queue"),
      table(["topic", "queue", "committed", "max", "lag", "in flight", "retrying"], progress.queues.map((x) =>
        [x.topic, x.queue_id, x.committed_offset, x.max_offset, x.lag, x.inflight, x.retrying || 0]))),
    ...writable(el("section", {}, el("h2", {}, "Reset offset to a time"), resetForm)),
    el("section", { id: "clients", "data-live": true }, el("h2", {}, "Connected gRPC clients"),
      clients.clients.length ? table(["client", "address", "subscriptions"], clients.clients.map((c) =>
        [c.client_id, c.address || c.peer || "", c.subscriptions.map((s) => `${s.topic} (${s.filter_type} ${s.filter})`).join(", ")]))
        : el("p", { class: "muted" }, "no client of this group is connected")),
    el("section", { id: "dead-letters", "data-live": true }, el("h2", {}, `Dead letters (${dlqTopic})`),
      letters.length ? table(["message", "from topic", "attempts", "stored", "body", ""], letters.map((m) => [
        el("a", { href: `#/message?id=${q(m.message_id)}` }, m.message_id), m.dead_letter_topic || "",
        m.dead_letter_attempts, fmtTime(m.store_timestamp), (m.body || "").slice(0, 60),
        writable(el("button", { onclick: () => act(() => api("POST",
          `/v1/topics/${q(dlqTopic)}/queues/${m.queue_id}/offsets/${m.queue_offset}/resend`),
        `Resend ${m.message_id} to ${m.dead_letter_topic}?`) }, "resend"))]))
        : el("p", { class: "muted" }, "no dead letters")));
}

function messageRows(messages) {
  return table(["message id", "topic", "queue", "offset", "tag", "keys", "stored"], messages.map((m) => [
    el("a", { href: `#/message?id=${q(m.message_id)}&topic=${q(m.topic)}` }, m.message_id),
    m.topic, m.queue_id, m.queue_offset, m.tag || "", (m.keys || []).join(", "), fmtTime(m.store_timestamp)]));
}

async function messagesPage(root, params) {
  const results = el("div", { id: "results" });
  const search = (path) => async (e) => {
    e.preventDefault();
    try {
      const found = await get(path(e.target));
      results.replaceChildren(found.messages.length ? messageRows(found.messages)
        : el("p", { class: "muted" }, "no message found"));
      clearError();
    } catch (err) { showError(err); }
  };
  const time = (f, n) => (formValue(f, n) ? Date.parse(formValue(f, n)) : "");
  root.replaceChildren(el("h2", {}, "Messages"),
    el("form", { class: "inline", id: "by-id", onsubmit: search((f) => `/v1/messages/${q(formValue(f, "id"))}`) },
      el("input", { name: "id", placeholder: "message id", required: true, size: 40 }),
      el("button", { type: "submit" }, "find by id")),
    el("form", { class: "inline", id: "by-key", onsubmit: search((f) =>
      `/v1/topics/${q(formValue(f, "topic"))}/messages?key=${q(formValue(f, "key"))}`) },
    el("input", { name: "topic", placeholder: "topic", required: true }),
    el("input", { name: "key", placeholder: "key", required: true }),
    el("button", { type: "submit" }, "find by key")),
    el("form", { class: "inline", id: "by-time", onsubmit: search((f) => {
      let path = `/v1/topics/${q(formValue(f, "topic"))}/scan?limit=100&begin_ms=${time(f, "begin")}&end_ms=${time(f, "end")}`;
      if (formValue(f, "filter")) path += `&filter_type=${formValue(f, "filter_type")}&filter=${q(formValue(f, "filter"))}`;
      return path;
    }) },
    el("input", { name: "topic", placeholder: "topic", required: true }),
    el("input", { name: "begin", placeholder: "from (ISO time)" }),
    el("input", { name: "end", placeholder: "to (ISO time)" }),
    el("select", { name: "filter_type" }, el("option", {}, "tag"), el("option", {}, "sql92")),
    el("input", { name: "filter", placeholder: "filter expression" }),
    el("button", { type: "submit" }, "find in time range")),
    results);
}

function hex(text, encoding) {
  const bytes = encoding === "base64" ? Uint8Array.from(atob(text), (c) => c.charCodeAt(0))
    : new TextEncoder().encode(text);
  const lines = [];
  for (let i = 0; i < bytes.length; i += 16) {
    const chunk = [...bytes.slice(i, i + 16)];
    lines.push(i.toString(16).padStart(8, "0") + "  " + chunk.map((b) => b.toString(16).padStart(2, "0")).join(" "));
  }
  return lines.join("\n");
}

function bodyView(m) {
  const views = { text: m.body_encoding === "utf-8" ? m.body : "(binary: see hex)", hex: hex(m.body, m.body_encoding) };
  try { views.json = JSON.stringify(JSON.parse(m.body), null, 2); } catch (_) { /* not JSON */ }
  const shown = el("pre", { id: "body" }, views.json || views.text);
  return el("div", {}, el("div", { class: "inline" }, Object.keys(views).map((k) =>
    el("button", { onclick: () => { shown.textContent = views[k]; }, id: `view-${k}` }, k))), shown);
}

// One line of the timeline for each event the broker recorded (docs/dashboard.md).
const DECIDERS = { producer: "its producer", check: "a check answer", operator: "an operator" };

function describe(e) {
  const attempt = e.attempt ? ` (attempt ${e.attempt})` : "";
  const decider = e.source === "group" ? `its transaction group ${e.group}` : DECIDERS[e.source] || e.source;
  switch (e.event) {
    case "stored": return `stored in ${e.topic} queue ${e.queue_id} at offset ${e.queue_offset}`;
    case "delivered": return e.mode === "pull"
      ? `pulled by group ${e.group} at offset ${e.queue_offset}`
      : `delivered to group ${e.group}${attempt}${e.client ? ` to client ${e.client}` : ""}, invisible for ${fmtAge(e.invisible_ms || 0)}`;
    case "acked": return `acked by group ${e.group}${attempt}`;
    case "invisible_changed": return `retried: group ${e.group} put it back, visible again in ${fmtAge(e.invisible_ms || 0)}${attempt}`;
    case "dead_lettered": return `dead-lettered by group ${e.group} after ${e.attempts} deliveries (to ${e.dead_letter_topic})`;
    case "resent": return `resent from the dead-letter topic as message ${e.message_id} to ${e.to_topic}`;
    case "resent_from": return `a resend of dead letter ${e.message_id}`;
    case "half_stored": return `half message stored (transaction ${e.transaction_id}, producer group ${e.producer_group || "none"})`;
    case "check_sent": return `check ${e.check} sent to a producer of its group`;
    case "check_answered": return `check answered: ${e.resolution}`;
    case "committed": return `committed by ${decider}`;
    case "rolled_back": return `rolled back by ${decider}`;
    case "parked": return `parked after ${e.checks} unanswered checks`;
    case "resumed": return "resumed by an operator";
    default: return e.event;
  }
}

// Pull consumers commit offsets rather than acking each message: say whose offset passed it.
async function committedBy(message) {
  const stats = await get(`/v1/statistics?topic=${q(message.topic)}&last_hour=false`);
  const groups = [...new Set(stats.rows.filter((r) => r.group).map((r) => r.group))];
  const lines = [];
  for (const group of groups) {
    const progress = await get(`/v1/groups/${q(group)}/progress?topic=${q(message.topic)}`);
    const queue = progress.queues.find((x) => x.queue_id === message.queue_id);
    if (!queue) continue;
    lines.push(queue.committed_offset > message.queue_offset
      ? `group ${group}'s committed offset (${queue.committed_offset}) is past it`
      : `group ${group}'s committed offset (${queue.committed_offset}) is not past it yet`);
  }
  return lines;
}

async function messagePage(root, params) {
  const id = params.get("id");
  const trace = await get(`/v1/messages/${q(id)}/trace`);
  // The trace has a "stored" event for each stored copy: without one (a rolled-back
  // transaction, or a message removed by retention) there is nothing to read, and asking
  // would only earn a 404.
  const found = !trace.events.some((e) => e.event === "stored") ? []
    : await get(`/v1/messages/${q(id)}`).then((r) => r.messages, (err) => {
      if (err.status === 404) return [];  // removed meanwhile
      throw err;
    });
  const original = found.find((m) => !m.dead_letter_group) || found[0];
  const message = found.find((m) => m.topic === params.get("topic")) || original;
  const offsets = original ? await committedBy(original) : [];
  const timeline = el("ol", { class: "timeline" }, trace.events.map((e) =>
    el("li", { "data-event": e.event }, el("span", { class: "when" }, fmtTime(e.time_ms)),
      ` ${describe(e)}${e.broker ? ` — on ${e.broker}` : ""}`)));
  root.replaceChildren(el("h2", {}, `Message ${id}`),
    message ? el("section", {}, el("h2", {}, "Properties"), table(["field", "value"], Object.entries(message)
      .filter(([k]) => !["body", "properties"].includes(k))
      .map(([k, v]) => [k, v === null ? "" : typeof v === "object" ? JSON.stringify(v) : String(v)])
      .concat(Object.entries(message.properties).map(([k, v]) => [`property ${k}`, v]))))
      : el("p", { class: "muted" }, "no stored copy (rolled back, or removed by retention): its trace follows"),
    ...(message ? [el("section", {}, el("h2", {}, "Body"), bodyView(message))] : []),
    el("section", { id: "trace" }, el("h2", {}, "Trace"), timeline,
      offsets.length ? el("ul", { class: "muted", id: "offsets" }, offsets.map((line) => el("li", {}, line))) : null,
      el("p", { class: "muted" }, "Recorded by the broker for topics with trace on; pull consumers commit offsets instead of acking each message.")));
}

// The check service's own schedule (next_check_ms), not an estimate.
function nextCheck(t, isParked, checkMax) {
  if (isParked) return "parked: operator decides";
  if (t.transaction_group) return `decided with transaction group ${t.transaction_group}`;
  if (t.next_check_ms === null || t.next_check_ms === undefined) return "";
  const when = `${fmtTime(t.next_check_ms)} (in ${fmtAge(Math.max(0, t.next_check_ms - Date.now()))})`;
  return el("span", { class: "next-check", "data-ms": t.next_check_ms },
    t.checks_sent >= checkMax ? `parked at the scan of ${when}` : when);
}

async function transactionsPage(root) {
  const [pending, parked, config] = await Promise.all([get("/v1/transactions?limit=1000"),
    get("/v1/transactions/parked?limit=1000"), get("/v1/config")]);
  const txn = config.transaction;
  // /v1/transactions lists every undecided transaction, parked ones too: they have their table.
  const underChecks = pending.transactions.filter((t) => t.state !== "parked");
  // The selection survives the live refresh (and is pruned to what still exists).
  const selected = session.selected;
  const known = new Set([...pending.transactions, ...parked.transactions].map((t) => t.transaction_id));
  for (const id of [...selected]) if (!known.has(id)) selected.delete(id);
  const rows = (list, isParked) => list.map((t) => [
    writable(el("input", { type: "checkbox", "data-id": t.transaction_id, checked: selected.has(t.transaction_id),
      onchange: (e) => (e.target.checked ? selected.add(t.transaction_id) : selected.delete(t.transaction_id)) })),
    t.transaction_id, t.topic, t.producer_group || "", fmtAge(t.age_ms), t.checks_sent,
    nextCheck(t, isParked, txn.check_max),
    (t.keys || []).join(", ")]);
  const decide = (verb) => () => {
    const ids = [...selected];
    if (!ids.length) { showError(new Error("select one or more transactions first")); return; }
    act(async () => {
      for (const id of ids) await api("POST", `/v1/transactions/${q(id)}/${verb}`);
    }, `${verb} ${ids.length} transaction(s)?`);
  };
  root.replaceChildren(el("h2", {}, "Transactions"),
    ...writable(el("div", { class: "inline" },
      el("button", { id: "commit", onclick: decide("commit") }, "commit selected"),
      el("button", { id: "rollback", class: "danger", onclick: decide("rollback") }, "roll back selected"),
      el("button", { id: "resume", onclick: decide("resume") }, "resume selected (parked)"))),
    el("section", { id: "pending" }, el("h2", {}, `Pending (${underChecks.length})`),
      table(["", "transaction", "topic", "producer group", "age", "checks", "next check", "keys"], rows(underChecks, false))),
    el("section", { id: "parked" }, el("h2", {}, `Parked after ${txn.check_max} checks (${parked.transactions.length})`),
      table(["", "transaction", "topic", "producer group", "age", "checks", "next check", "keys"], rows(parked.transactions, true))));
}

// One broker group: its master and each replica, with the replica's progress as the master
// reports it (lag in bytes of commit log and in milliseconds, in the in-sync set or not).
function brokerGroupSection(g) {
  const isr = new Set(g.isr || []);
  const live = new Set(g.members || []);
  const progress = g.replicas || {};
  const names = [...new Set([...(g.master ? [g.master] : []), ...(g.members || []), ...(g.isr || []),
    ...Object.keys(progress)])]
    .sort((a, b) => (a === g.master ? -1 : b === g.master ? 1 : a.localeCompare(b)));
  const rows = names.map((name) => {
    const p = progress[name] || {};
    const master = name === g.master;
    return [name, master ? "master" : "replica",
      el("span", { class: live.has(name) ? "state-ok" : "state-down" }, live.has(name) ? "live" : "down"),
      master ? "" : isr.has(name) ? "yes" : "no",
      master || p.connected === undefined ? "" : p.connected ? "yes" : "no",
      master || p.lag_bytes === undefined ? "" : fmtBytes(p.lag_bytes),
      master || p.lag_ms === undefined ? "" : `${p.lag_ms} ms`];
  });
  const facts = [`master ${g.master || "none"}`, `epoch ${g.epoch ?? ""}`,
    g.mode ? `${g.mode} replication` : null,
    g.min_insync_replicas !== undefined && g.min_insync_replicas !== null ? `at least ${g.min_insync_replicas} in sync` : null,
    g.failovers !== undefined ? `${g.failovers} failover(s)` : null,
    g.switchovers !== undefined ? `${g.switchovers} switchover(s)` : null].filter(Boolean);
  return el("section", { class: "broker-group", "data-group": g.group },
    el("h2", {}, `Broker group ${g.group}`), el("p", { class: "muted" }, facts.join(", ")),
    table(["member", "role", "state", "in sync", "connected", "replication lag", "lag (time)"], rows));
}

async function clusterPage(root) {
  const cluster = await get("/v1/cluster");
  const groups = cluster.broker_groups || [];
  const warnings = [...brokerWarnings(cluster.brokers), ...groupWarnings(groups)];
  root.replaceChildren(el("h2", {}, `Cluster ${cluster.cluster}`),
    ...(warnings.length ? [el("section", { id: "cluster-warnings" }, el("h2", {}, "Warnings"),
      el("ul", {}, warnings.map((w) => el("li", { class: "warning" }, w))))] : []),
    el("section", { id: "cluster-brokers" }, el("h2", {}, "Brokers"),
      table(["broker", "role", "state", "gRPC", "admin", "version", "uptime", "queues"], cluster.brokers.map((b) =>
        [brokerName(b), b.role || "",
          el("span", { class: brokerState(b)[1] ? "state-ok" : "state-down" }, brokerState(b)[0]),
          b.grpc || b.endpoint || "", b.admin || "", b.version || "", b.uptime_ms ? fmtAge(b.uptime_ms) : "",
          b.queues ?? ""]))),
    ...((cluster.proxies || []).length ? [el("section", { id: "cluster-proxies" }, el("h2", {}, "Proxies"),
      table(["proxy", "state", "endpoint", "uptime"], cluster.proxies.map((p) => [p.name,
        el("span", { class: p.state === "live" ? "state-ok" : "state-down" }, p.state || ""),
        p.endpoint || "", p.uptime_ms ? fmtAge(p.uptime_ms) : ""])))] : []),
    ...(groups.length ? groups.map(brokerGroupSection)
      : [el("p", { class: "notice", id: "no-replication" }, cluster.proxies === undefined
        ? "One broker on its own (halfmoon serve): no replicas. In cluster mode this page lists " +
          "each broker group's master, replicas, epoch and replication lag (docs/replication.md)."
        : "No broker group is replicated in this cluster (docs/replication.md).")]));
}

// -- routing and live refresh -------------------------------------------------------------

// How a page refreshes: true, all of it; PARTS, only its elements marked data-live (each with
// an id), leaving its forms alone; false, only after an action.
const PARTS = "parts";
const PAGES = {
  overview: [overviewPage, true], topics: [topicsPage, PARTS], topic: [topicPage, PARTS],
  groups: [groupsPage, PARTS], group: [groupPage, PARTS], messages: [messagesPage, false],
  message: [messagePage, false], transactions: [transactionsPage, true], cluster: [clusterPage, true],
};

let renderSerial = 0;

async function route() {
  const [name, query] = (location.hash.slice(2) || "overview").split("?");
  const [render, live] = PAGES[name] || PAGES.overview;
  const params = new URLSearchParams(query || "");
  for (const timer of session.timers) clearInterval(timer);
  session.timers = [];
  for (const link of document.querySelectorAll("#nav a")) {
    link.classList.toggle("active", link.getAttribute("href").slice(2).split("?")[0] === name.replace(/^(topic|group|message|user)$/, "$1s"));
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
      if (serial === renderSerial) showError(err);
    }
  };
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
