// Operating what is stored, on the same helpers as dashboard.js (loaded first): a consumer
// group's backlog in a topic (peek at it without consuming, purge it) and the Producers page.
"use strict";

// The backlog of one group in one topic: the messages past its committed offsets, read
// from the store (GET /v1/groups/{g}/peek: nothing is delivered, nothing moves), and a
// purge that moves the group's offsets to the queues' ends (other groups keep theirs).
async function backlogPage(root, params) {
  const group = params.get("group");
  const topic = params.get("topic");
  const limit = Number(params.get("limit") || 20);
  const peek = await get(`/v1/groups/${q(group)}/peek?topic=${q(topic)}&limit=${limit}`);
  const purge = el("button", { class: "danger", id: "purge", onclick: () => act(
    () => api("POST", `/v1/groups/${q(group)}/purge`, { topic }),
    `Purge group ${group}'s ${peek.backlog} message(s) in ${topic}? The group will not get them; ` +
      "other groups keep theirs.", undefined,
    (answer) => `purged ${answer.purged} message(s) of ${topic} for group ${group}`) }, "purge");
  root.replaceChildren(
    el("h2", {}, `Backlog of group `, el("a", { href: `#/group?name=${q(group)}` }, group), ` in ${topic}`),
    el("p", { id: "backlog-summary", "data-live": true },
      `${peek.backlog} message(s) not yet consumed; showing the first ${peek.messages.length} ` +
      "(peeked: nothing is delivered, acknowledged or moved)"),
    ...writable(el("section", {}, el("h2", {}, "Purge"), el("p", { class: "muted" },
      "Moves this group's offsets in this topic to the end of every queue."), purge)),
    el("section", { id: "backlog-queues", "data-live": true }, el("h2", {}, "Per queue"),
      table(["queue", "from offset", "backlog"], peek.queues.map((x) => [x.queue_id, x.from_offset, x.backlog]))),
    el("section", { id: "peeked", "data-live": true }, el("h2", {}, "Next messages"),
      peek.messages.length ? table(["message", "queue", "offset", "tag", "keys", "stored", "body"],
        peek.messages.map((m) => [el("a", { href: `#/message?id=${q(m.message_id)}&topic=${q(m.topic)}` }, m.message_id),
          m.queue_id, m.queue_offset, m.tag || "", (m.keys || []).join(", "), fmtTime(m.store_timestamp),
          m.body_encoding === "base64" ? "(binary)" : (m.body || "").slice(0, 80)]))
        : el("p", { class: "muted" }, "nothing left to consume")));
}

PAGES.backlog = [backlogPage, PARTS];
TITLES.backlog = "Backlog";

// Every connected producer (GET /v1/producers: the clients the Overview counts as
// producers), with what the client says it is and how fast it sends.
async function producersPage(root) {
  const { clients, registry } = await get("/v1/producers");
  root.replaceChildren(el("h2", {}, "Producers"),
    el("p", { class: "muted" }, "Clients connected now that produce: an official client from its telemetry stream " +
      "(it leaves this list as soon as that stream ends), a client without one while it heartbeats or sends. " +
      "Send rate: messages per second over the last minute."),
    !registry ? el("p", { class: "muted" }, "connected clients are unknown here (the admin API runs without the gRPC server)")
      : clients.length ? table(["client", "group", "address", "language", "version", "topics", "sent", "send rate", "idle"],
        clients.map((c) => [c.client_id, c.group || "", c.address || c.peer || "", c.language || "", c.version || "",
          (c.publishes || []).map((t, i) => [i ? ", " : "", el("a", { href: `#/topic?name=${q(t)}` }, t)]),
          c.messages_sent, `${c.send_rate.toFixed(2)} msg/s`, fmtAge(c.idle_seconds * 1000)]))
        : el("p", { class: "muted", id: "no-producers" }, "no producer is connected"));
}

PAGES.producers = [producersPage, true];
TITLES.producers = "Producers";

// Definitions: the topics, groups, users, policies and the AMQP topology as one JSON
// document (GET and POST /v1/definitions, super users only: it holds secret keys). Export
// downloads it; import sends a file, which the API validates whole before it applies any.
const DEFINITION_KINDS = ["topics", "groups", "users", "acls", "vhosts", "exchanges", "queues", "bindings"];

async function definitionsPage(root) {
  const result = el("div", { id: "import-result" });
  const exportButton = el("button", { id: "export", onclick: async () => {
    try {
      const doc = await get("/v1/definitions");
      const blob = new Blob([JSON.stringify(doc, null, 2)], { type: "application/json" });
      const link = el("a", { href: URL.createObjectURL(blob), download: `halfmoon-definitions-${doc.broker}.json` });
      link.click();
      URL.revokeObjectURL(link.href);
      clearError();
      showDone("exported " + DEFINITION_KINDS.filter((k) => k in doc).map((k) => `${doc[k].length} ${k}`).join(", "));
    } catch (err) { showError(err); }
  } }, "export definitions");
  const importForm = el("form", { class: "inline", id: "import", onsubmit: async (e) => {
    e.preventDefault();
    const file = e.target.elements.file.files[0];
    if (!file) { showError(new Error("choose a definitions file first")); return; }
    let doc;
    try {
      doc = JSON.parse(await file.text());
    } catch (err) {
      showError(new ApiFailure(0, "INVALID_DEFINITIONS", `${file.name} is not JSON: ${err.message}`));
      return;
    }
    if (!window.confirm(`Import ${file.name}? Missing definitions are created and differing ones updated; nothing is deleted.`)) return;
    showDone("");
    try {
      const answer = await api("POST", "/v1/definitions", doc);
      clearError();
      const said = (action) => DEFINITION_KINDS.map((k) => `${answer[action][k].length} ${k}`).join(", ");
      showDone(`imported ${file.name}: created ${said("created")}; updated ${said("updated")}`);
      result.replaceChildren(table(["", ...DEFINITION_KINDS], ["created", "updated", "unchanged"].map((a) =>
        [a, ...DEFINITION_KINDS.map((k) => answer[a][k].join(", "))])));
    } catch (err) {
      result.replaceChildren(el("p", { class: "warning" }, "nothing was imported: the document was refused as a whole"));
      showError(err);
    }
  } }, field("definitions file", el("input", { type: "file", name: "file", accept: "application/json,.json" })),
  el("button", { type: "submit" }, "import"));
  root.replaceChildren(el("h2", {}, "Definitions"),
    el("p", { class: "muted" }, "Topics, consumer groups, users (with their secret keys) and ACL policies as one " +
      "JSON document; system topics are left out. An import is checked whole first: a document with any error " +
      "changes nothing. Importing the same document twice is the same as once."),
    ...(session.canManageUsers ? [el("section", {}, el("h2", {}, "Export"), exportButton),
      el("section", {}, el("h2", {}, "Import"), importForm, result)]
      : [el("p", { class: "muted", id: "definitions-refused" }, "Only super users export and import definitions.")]));
}

PAGES.definitions = [definitionsPage, false];
TITLES.definitions = "Definitions";
