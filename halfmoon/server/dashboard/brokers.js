// The brokers' pages, on the helpers of dashboard.js (loaded first): the Overview (counts,
// traffic, clients, and what is wrong with the brokers of a cluster) and the Cluster page
// (each broker group's master and replicas with their replication lag).
"use strict";

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
      card("connected clients", status.clients, "clients"),
      card("producers", el("a", { href: "#/producers" }, status.producers ?? ""), "producers")),
    el("section", { id: "warnings" }, el("h2", {}, "Warnings"),
      warnings.length ? el("ul", {}, warnings.map((w) => el("li", { class: "warning" }, w)))
        : el("p", { class: "muted" }, "none")),
    el("section", {}, el("h2", {}, "Traffic"), chart(sumSeries(inRows), sumSeries(outRows), stats.now_ms)),
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

PAGES.overview = [overviewPage, true];
PAGES.cluster = [clusterPage, true];
TITLES.overview = "Overview";
TITLES.cluster = "Cluster";
