// Finding and reading messages, on the helpers of dashboard.js (loaded first): the Messages
// search (by key, by id, or a time range paged 100 at a time), one message with its body and
// the trace the broker recorded for it, and the Transactions page (pending and parked).
"use strict";

const letterKey = (topic, m) => `${topic}/${m.queue_id}/${m.queue_offset}`;
const resentAs = (topic, m) => session.resent.get(letterKey(topic, m));

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
      field("message id", el("input", { name: "id", required: true, size: 40 })),
      el("button", { type: "submit" }, "find by id")),
    el("form", { class: "inline", id: "by-key", onsubmit: search((f) =>
      `/v1/topics/${q(formValue(f, "topic"))}/messages?key=${q(formValue(f, "key"))}`) },
    field("topic", el("input", { name: "topic", required: true })),
    field("key", el("input", { name: "key", required: true })),
    el("button", { type: "submit" }, "find by key")),
    el("form", { class: "inline", id: "by-time", onsubmit: async (e) => {
      e.preventDefault();
      try {
        await timeRangeSearch(e.target, results, time);
        clearError();
      } catch (err) { showError(err); }
    } },
    field("topic", el("input", { name: "topic", required: true })),
    field("from", el("input", { name: "begin", placeholder: "2026-01-31T12:00:00Z" })),
    field("to", el("input", { name: "end", placeholder: "2026-01-31T13:00:00Z" })),
    field("filter", el("select", { name: "filter_type" }, el("option", {}, "tag"), el("option", {}, "sql92"))),
    field("expression", el("input", { name: "filter" })),
    el("button", { type: "submit" }, "find in time range")),
    results);
}

// A time-range search shows 100 messages a page; "more" continues every queue where the
// previous answer stopped (its next_offsets), queue by queue, until 100 more are found.
const SCAN_PAGE = 100;

async function timeRangeSearch(form, results, time) {
  const topic = formValue(form, "topic");
  let common = `end_ms=${time(form, "end")}`;
  if (formValue(form, "filter")) common += `&filter_type=${formValue(form, "filter_type")}&filter=${q(formValue(form, "filter"))}`;
  const first = await get(`/v1/topics/${q(topic)}/scan?limit=${SCAN_PAGE}&begin_ms=${time(form, "begin")}&${common}`);
  const shown = [...first.messages];
  // Queues still to read from, with where to go on; a complete answer leaves none.
  let pending = first.complete ? [] : Object.entries(first.next_offsets).map(([queue, offset]) => [Number(queue), offset]);
  const draw = () => {
    const more = pending.length ? el("button", { id: "more", onclick: async () => {
      try {
        const page = [];
        while (pending.length && page.length < SCAN_PAGE) {
          const [queue, offset] = pending[0];
          const got = await get(`/v1/topics/${q(topic)}/scan?queue=${queue}&offset=${offset}&limit=${SCAN_PAGE - page.length}&${common}`);
          page.push(...got.messages);
          if (got.complete) pending.shift();
          else pending[0] = [queue, got.next_offsets[String(queue)]];
        }
        shown.push(...page);
        clearError();
        draw();
      } catch (err) { showError(err); }
    } }, `more (${shown.length} shown)`) : el("p", { class: "muted", id: "all-shown" }, `all ${shown.length} shown`);
    results.replaceChildren(shown.length ? messageRows(shown) : el("p", { class: "muted" }, "no message found"),
      shown.length ? more : null);
  };
  draw();
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
      .filter(([, v]) => v !== null && v !== "" && !(Array.isArray(v) && !v.length))  // no empty rows
      .map(([k, v]) => [k, isTimeField(k, v) ? `${fmtTime(v)} (${v})`
        : typeof v === "object" ? JSON.stringify(v) : String(v)])
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

PAGES.messages = [messagesPage, false];
PAGES.message = [messagePage, false];
PAGES.transactions = [transactionsPage, true];
TITLES.messages = "Messages";
TITLES.message = "Message";
TITLES.transactions = "Transactions";
