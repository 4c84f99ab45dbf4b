// The Topics and Consumer groups pages, on the helpers of dashboard.js (loaded first): lists
// a page at a time with user and system topics apart, a topic with its route and rates, a
// group with its progress, clients and dead letters (resent once per click).
"use strict";

function pager(total, offset, go) {
  return el("div", { class: "pager" },
    el("button", { onclick: () => go(Math.max(0, offset - PAGE_SIZE)), disabled: offset === 0 }, "previous"),
    el("span", { class: "muted" },
      total ? `${offset + 1}–${Math.min(total, offset + PAGE_SIZE)} of ${total}` : "none"),
    el("button", { onclick: () => go(offset + PAGE_SIZE), disabled: offset + PAGE_SIZE >= total }, "next"));
}

// %DLQ%group, %RETRY%group and the internal topics: the broker's, not the user's.
const isSystemTopic = (name) => name.startsWith("%") || name.startsWith("rmq_sys_") ||
  name.startsWith("RMQ_SYS_") || name.startsWith("TBW102") || name.startsWith("SCHEDULE_TOPIC");

async function topicsPage(root, params) {
  const search = params.get("search") || "";
  const offset = Number(params.get("offset") || 0);
  const withSystem = params.get("system") === "1";
  const [found, stats] = await Promise.all([
    get(`/v1/topics?search=${q(search)}&offset=${offset}&limit=${PAGE_SIZE}`), get("/v1/statistics?last_hour=false")]);
  // Rates and backlog per topic from one statistics answer: messages in per second,
  // and the lag of the groups that consumed the topic in the last 24 h.
  const rate = new Map(), backlog = new Map();
  for (const row of stats.rows) {
    if (!row.group) rate.set(row.topic, row.per_second);
    else backlog.set(row.topic, (backlog.get(row.topic) || 0) + (row.lag || 0));
  }
  const go = (o, s = search, sys = withSystem) => {
    location.hash = `#/topics?search=${q(s)}&offset=${o}${sys ? "&system=1" : ""}`;
  };
  const searchForm = el("form", { class: "inline", onsubmit: (e) => { e.preventDefault(); go(0, formValue(e.target, "search")); } },
    field("search", el("input", { name: "search", value: search })),
    el("button", { type: "submit" }, "search"),
    field("show system topics (%DLQ%, %RETRY%)", el("input", { type: "checkbox", id: "show-system",
      checked: withSystem, onchange: (e) => go(0, search, e.target.checked) })));
  const shownTopics = found.topics.filter((t) => withSystem || !isSystemTopic(t.name));
  const hiddenCount = found.topics.length - shownTopics.length;
  const createForm = el("form", { class: "inline", id: "create-topic", onsubmit: (e) => {
    e.preventDefault();
    const f = e.target;
    const name = formValue(f, "name");
    act(() => api("POST", "/v1/topics", { name, message_type: formValue(f, "message_type"),
      queue_count: Number(formValue(f, "queue_count")) }),
    `Create ${formValue(f, "message_type")} topic ${name} with ${formValue(f, "queue_count")} queue(s)?`,
    `#/topics?search=${q(name)}&offset=0`, `created topic ${name}`);
  } },
  field("new topic", el("input", { name: "name", required: true })),
  field("type", el("select", { name: "message_type" }, ["normal", "fifo", "delay", "transaction", "priority", "lite"].map((t) => el("option", {}, t)))),
  field("queues", el("input", { name: "queue_count", type: "number", min: 1, value: 8, style: "width:5em" })),
  el("button", { type: "submit" }, "create topic"));
  root.replaceChildren(el("h2", {}, "Topics"), searchForm, ...writable(createForm),
    el("div", { id: "topic-list", "data-live": true }, pager(found.total, offset, go),
    hiddenCount ? el("p", { class: "muted", id: "hidden-system" },
      `${hiddenCount} system topic(s) on this page hidden`) : null,
    shownTopics.length ? null : el("p", { class: "muted" }, "no topic"),
    table(["name", "type", "queues", "perm", "in/s", "backlog", "created", ""], shownTopics.map((t) => [
      el("a", { href: `#/topic?name=${q(t.name)}` }, t.name), t.message_type, t.queue_count,
      t.perm, (rate.get(t.name) || 0).toFixed(2), backlog.has(t.name) ? backlog.get(t.name) : "",
      fmtTime(t.created_ms),
      writable(el("button", { class: "danger", onclick: () => act(
        () => api("DELETE", `/v1/topics/${q(t.name)}`), `Delete topic ${t.name} and its messages?`,
        undefined, `deleted topic ${t.name}`) }, "delete"))]))));
}

async function topicPage(root, params) {
  const name = params.get("name");
  const [topic, status, route, rates] = await Promise.all([get(`/v1/topics/${q(name)}`),
    get(`/v1/topics/${q(name)}/status`), get(`/v1/topics/${q(name)}/route`), rateSection("topic", name)]);
  const updateForm = el("form", { class: "inline", id: "update-topic", onsubmit: (e) => {
    e.preventDefault();
    act(() => api("PATCH", `/v1/topics/${q(name)}`, { queue_count: Number(formValue(e.target, "queue_count")),
      perm: formValue(e.target, "perm") }), `Change topic ${name}?`, undefined, `changed topic ${name}`);
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
  } }, field("body", el("input", { name: "body", required: true })),
  field("tag", el("input", { name: "tag" })), field("key", el("input", { name: "key" })),
  el("button", { type: "submit" }, "send test message"));
  root.replaceChildren(el("h2", {}, `Topic ${name}`),
    el("p", {}, `type ${topic.message_type}, ${topic.queue_count} queues, perm ${topic.perm}`),
    ...writable(el("section", {}, el("h2", {}, "Change"), updateForm),
      el("section", {}, el("h2", {}, "Send a test message"), sendForm, result)),
    el("section", { id: "queues", "data-live": true }, el("h2", {}, "Queues"),
      table(["queue", "min offset", "max offset", "messages"],
        status.queues.map((x) => [x.queue_id, x.min_offset, x.max_offset, x.max_offset - x.min_offset]))),
    el("section", { id: "route", "data-live": true }, el("h2", {}, "Route"), routeTable(route)), rates);
}

// A topic's route (its queues, each with its permission, accepted message types and
// the broker that holds it, reached at the address clients use) as a table.
function routeTable(route) {
  if (!route.queues.length) return el("p", { class: "muted" }, "no queue is routed");
  return table(["queue", "perm", "accepts", "broker", "clients connect to"], route.queues.map((x) => [
    x.queue_id, x.perm, (x.accepted_types || []).join(", "), x.broker, x.address || ""]));
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
  const createForm = el("form", { class: "inline", id: "create-group", onsubmit: (e) => {
    e.preventDefault();
    const f = e.target;
    const name = formValue(f, "name");
    act(() => api("POST", "/v1/groups", { name, fifo: f.elements.fifo.checked,
      max_delivery_attempts: Number(formValue(f, "max_delivery_attempts")),
      consume_from: formValue(f, "consume_from") }),
    `Create consumer group ${name}?`, `#/group?name=${q(name)}`, `created consumer group ${name}`);
  } },
  field("new group", el("input", { name: "name", required: true })),
  field("max deliveries", el("input", { name: "max_delivery_attempts", type: "number", min: 1, value: 17, style: "width:5em" })),
  field("consume from", el("select", { name: "consume_from" }, ["auto", "earliest", "latest"].map((c) => el("option", {}, c)))),
  field("fifo", el("input", { name: "fifo", type: "checkbox" })),
  el("button", { type: "submit" }, "create group"));
  root.replaceChildren(el("h2", {}, "Consumer groups"),
    el("form", { class: "inline", onsubmit: (e) => { e.preventDefault(); go(0, formValue(e.target, "search")); } },
      field("search", el("input", { name: "search", value: search })),
      el("button", { type: "submit" }, "search")),
    ...writable(createForm),
    el("div", { id: "group-list", "data-live": true }, pager(found.total, offset, go),
    found.groups.length ? null : el("p", { class: "muted" }, "no consumer group"),
    table(["name", "fifo", "max attempts", "lag (consumed in 24 h)", "dead letters", "consume from", "retrying", ""], found.groups.map((g) => [
      el("a", { href: `#/group?name=${q(g.name)}` }, g.name), g.fifo ? "yes" : "no",
      g.max_delivery_attempts, lag.has(g.name) ? lag.get(g.name) : "", deadLetters.get(g.name) || 0,
      g.consume_from, retrying.has(g.name) ? retrying.get(g.name) : "",
      writable(el("button", { class: "danger", onclick: () => act(
        () => api("DELETE", `/v1/groups/${q(g.name)}`), `Delete consumer group ${g.name} and its offsets?`,
        undefined, `deleted consumer group ${g.name}`) }, "delete"))]))));
}

async function groupPage(root, params) {
  const name = params.get("name");
  const [group, progress, clients, rates] = await Promise.all([get(`/v1/groups/${q(name)}`),
    get(`/v1/groups/${q(name)}/progress`), get(`/v1/groups/${q(name)}/clients`), rateSection("group", name)]);
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
      `Move group ${name}'s offsets on ${formValue(f, "topic")} to ${fmtTime(when)}?`, undefined,
      `moved group ${name}'s offsets on ${formValue(f, "topic")} to ${fmtTime(when)}`);
  } }, field("topic", el("select", { name: "topic" }, topics.map((t) => el("option", {}, t)))),
  // No default: "now" would skip everything not yet consumed, the opposite of a replay.
  field("time", el("input", { name: "time", required: true, placeholder: "2026-01-31T12:00:00Z" })),
  el("button", { type: "submit" }, "reset offset"));
  const updateForm = el("form", { class: "inline", id: "update-group", onsubmit: (e) => {
    e.preventDefault();
    const f = e.target;
    act(() => api("PATCH", `/v1/groups/${q(name)}`, {
      max_delivery_attempts: Number(formValue(f, "max_delivery_attempts")), consume_from: formValue(f, "consume_from") }),
    `Change consumer group ${name}?`, undefined, `changed consumer group ${name}`);
  } },
  field("max deliveries", el("input", { name: "max_delivery_attempts", type: "number", min: 1, value: group.max_delivery_attempts, style: "width:5em" })),
  field("consume from", el("select", { name: "consume_from" }, ["auto", "earliest", "latest"].map((c) =>
    el("option", { selected: c === group.consume_from }, c)))),
  el("button", { type: "submit" }, "update"));
  const inflight = progress.queues.reduce((s, x) => s + x.inflight, 0);
  const retrying = progress.queues.reduce((s, x) => s + (x.retrying || 0), 0);
  root.replaceChildren(el("h2", {}, `Consumer group ${name}`),
    el("p", { id: "group-summary", "data-live": true }, `fifo ${group.fifo ? "yes" : "no"}, at most ${group.max_delivery_attempts} deliveries, ` +
      `${inflight} in flight (delivered, awaiting ack or retry), ${retrying} of them being retried ` +
      `(delivered more than once), ${deadLetters} dead letter(s)` +
      (deadLetters > letters.length ? ` (the first ${letters.length} below)` : "")),
    el("section", { id: "lag", "data-live": true }, el("h2", {}, "Lag per queue"),
      table(["topic", "queue", "committed", "max", "lag", "in flight", "retrying"], progress.queues.map((x) =>
        [x.topic, x.queue_id, x.committed_offset, x.max_offset, x.lag, x.inflight, x.retrying || 0])),
      // operate.js: peek at the backlog without consuming it, and purge it.
      el("p", {}, "backlog: ", topics.map((t) => el("a", { class: "peek", href: `#/backlog?group=${q(name)}&topic=${q(t)}` },
        `${t} (peek${session.canWrite ? ", purge" : ""}) `)))),
    rates,
    ...writable(el("section", {}, el("h2", {}, "Change"), updateForm),
      el("section", {}, el("h2", {}, "Reset offset to a time"), resetForm)),
    el("section", { id: "clients", "data-live": true }, el("h2", {}, "Connected gRPC clients"),
      clients.clients.length ? table(["client", "address", "subscriptions"], clients.clients.map((c) =>
        [c.client_id, c.address || c.peer || "", c.subscriptions.map((s) => `${s.topic} (${s.filter_type} ${s.filter})`).join(", ")]))
        : el("p", { class: "muted" }, "no client of this group is connected")),
    el("section", { id: "dead-letters", "data-live": true }, el("h2", {}, `Dead letters (${dlqTopic})`),
      letters.length ? table(["message", "from topic", "attempts", "stored", "body", ""], letters.map((m) => [
        el("a", { href: `#/message?id=${q(m.message_id)}` }, m.message_id), m.dead_letter_topic || "",
        m.dead_letter_attempts, fmtTime(m.store_timestamp), (m.body || "").slice(0, 60),
        resentAs(dlqTopic, m) ? el("span", { class: "resent" }, "resent as ",
          el("a", { href: `#/message?id=${q(resentAs(dlqTopic, m))}` }, resentAs(dlqTopic, m)))
          : writable(el("button", { onclick: () => act(async () => {
            const copy = await api("POST", `/v1/topics/${q(dlqTopic)}/queues/${m.queue_id}/offsets/${m.queue_offset}/resend`);
            session.resent.set(letterKey(dlqTopic, m), copy.message_id);  // one resend per click, not per visit
            return copy;
          }, `Resend ${m.message_id} to ${m.dead_letter_topic}?`, undefined,
          (copy) => `resent ${m.message_id} to ${copy.topic} as ${copy.message_id}`) }, "resend"))]))
        : el("p", { class: "muted" }, "no dead letters")));
}

PAGES.topics = [topicsPage, PARTS];
PAGES.topic = [topicPage, PARTS];
PAGES.groups = [groupsPage, PARTS];
PAGES.group = [groupPage, PARTS];
TITLES.topics = "Topics";
TITLES.topic = "Topic";
TITLES.groups = "Consumer groups";
TITLES.group = "Consumer group";
