// The PairMQ status page: polls /api/v1/group (the serving node asks all three nodes) every second and
// follows this node's decision stream. Everything is written with textContent: no HTML from the API.
"use strict";

// Requests go to location.origin, never relative to the page's URL: a page opened as
// http://admin:PASS@host:8080/ would pass its credentials on, and fetch refuses URLs that hold credentials.
function api(path) { return new URL(path, location.origin).href; }

const POLL_MS = 1000;
const MAX_DECISIONS = 30;
const ROLES = ["primary", "backup", "monitor"];
let previous = null;  // {at, counters: {role: {in, out}}} for the message rates

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v; else node.setAttribute(k, v);
  }
  for (const child of children) node.append(child);
  return node;
}

function set(id, text) { document.getElementById(id).textContent = text; }

function seconds(ms) {
  if (ms === null || ms === undefined) return "never";
  if (ms < 10000) return (ms / 1000).toFixed(1) + " s";
  if (ms < 120000) return Math.round(ms / 1000) + " s";
  return Math.round(ms / 60000) + " min";
}

function metric(node, name) {
  const v = node.metrics ? node.metrics[name] : undefined;
  return v === undefined ? null : v;
}

function nodeCard(node) {
  const reachable = node.reachable;
  const classes = ["node", node.role];
  if (!reachable) classes.push("unreachable");
  else if (node.serving) classes.push("active");
  const card = el("article", {"class": classes.join(" "), "id": "node-" + node.role,
                              "data-reachable": String(reachable),
                              "data-activity": reachable ? node.activity : "unreachable",
                              "data-epoch": reachable ? String(node.epoch) : ""});
  const badgeText = !reachable ? "unreachable" : node.serving ? "active" :
    node.role === "monitor" ? "monitor" : node.activity === "Mate Active" ? "standby" : node.activity.toLowerCase();
  card.append(el("h3", {}, node.role, el("span", {"class": "badge"}, badgeText)));
  card.append(el("div", {"class": "address"}, node.address || ""));
  if (!reachable) {
    card.append(el("div", {"class": "error"}, "Node unreachable: " + (node.error || "no answer")));
    return card;
  }
  const dl = el("dl");
  const row = (k, v, cls) => { dl.append(el("dt", {}, k), el("dd", cls ? {"class": cls} : {}, v)); };
  row("Activity", node.activity);
  row("Epoch", String(node.epoch));
  row("Redundancy", node.redundancy_status, node.redundancy_status === "Up" ? "ok" : "bad");
  if (node.in_sync !== null) row("In sync", node.in_sync ? "yes" : "no", node.in_sync ? "ok" : "bad");
  if (node.config_sync) row("Config-sync", node.config_sync.status + " (v" + node.config_sync.version + ")",
                            node.config_sync.status === "In-Sync" ? "ok" : "bad");
  const peers = node.peers.map(p => p.role + (p.seen ? " \u2713" : " \u2717")).join("  ");
  row("Sees", peers);
  row("Up for", seconds(node.uptime_ms));
  card.append(dl);
  const last = node.decisions && node.decisions.length ? node.decisions[node.decisions.length - 1] : null;
  if (last) card.append(el("div", {"class": "last"}, "Last: " + last.reason + " (" + seconds(last.ms_ago) + " ago)"));
  return card;
}

function render(doc) {
  const nodes = ROLES.map(r => doc.nodes.find(n => n.role === r)).filter(Boolean);
  set("group-name", doc.group);
  set("served-by", doc.served_by);
  document.getElementById("nodes").replaceChildren(...nodes.map(nodeCard));
  const up = nodes.filter(n => n.reachable);
  const active = up.find(n => n.serving);
  set("active-node", active ? active.role : "none");
  set("epoch", up.length ? String(Math.max(...up.map(n => n.epoch))) : "\u2013");
  const routing = up.filter(n => n.role !== "monitor");
  const redundancy = active ? active.redundancy_status : (routing[0] ? routing[0].redundancy_status : "Down");
  set("redundancy", redundancy);
  const cs = (active || routing[0] || {}).config_sync;
  set("config-sync", cs ? cs.status : "\u2013");
  const down = nodes.filter(n => !n.reachable).map(n => n.role);
  const banner = document.getElementById("banner");
  banner.hidden = down.length === 0;
  banner.textContent = down.length ? "Unreachable: " + down.join(", ") : "";
  renderNumbers(routing, active);
  if (!streaming) renderPolledDecisions(doc.nodes.find(n => n.role === doc.served_by));
  set("updated", "updated " + new Date().toLocaleTimeString([], {hour12: false}));  // as the decision times
  document.body.dataset.state = "ready";
}

function renderNumbers(routing, active) {
  const now = performance.now();
  const counters = {};
  for (const n of routing) {
    counters[n.role] = {in: metric(n, "pairmq_messages_received_total") || 0,
                        out: metric(n, "pairmq_messages_sent_total") || 0};
  }
  if (previous) {
    const dt = (now - previous.at) / 1000;
    let rin = 0, rout = 0;
    for (const [role, c] of Object.entries(counters)) {
      const p = previous.counters[role];
      if (p && c.in >= p.in && c.out >= p.out) { rin += c.in - p.in; rout += c.out - p.out; }
    }
    set("rate-in", dt > 0 ? (rin / dt).toFixed(1) : "\u2013");
    set("rate-out", dt > 0 ? (rout / dt).toFixed(1) : "\u2013");
  }
  previous = {at: now, counters};
  const show = (id, v) => set(id, v === null || v === undefined ? "\u2013" : String(v));
  show("spool-depth", active ? metric(active, "pairmq_spool_queued_messages") : null);
  show("clients", active ? metric(active, "pairmq_mqtt_clients") : null);
  const linkUp = active ? metric(active, "pairmq_mate_link_up") : null;
  set("link-state", linkUp === null ? "\u2013" : linkUp ? "up" : "down");
  show("lag-ops", active ? metric(active, "pairmq_mate_link_lag_ops") : null);
  show("lag-bytes", active ? metric(active, "pairmq_mate_link_lag_bytes") : null);
  const rtt = active ? metric(active, "pairmq_mate_link_round_trip_seconds") : null;
  show("rtt", rtt === null ? null : Math.round(rtt * 1000));
}

async function poll() {
  try {
    const response = await fetch(api("/api/v1/group"), {cache: "no-store"});
    if (!response.ok) throw new Error("HTTP " + response.status);
    render(await response.json());
  } catch (err) {
    const banner = document.getElementById("banner");
    banner.hidden = false;
    banner.textContent = "The node serving this page does not answer (" + err.message + "); retrying every second.";
    set("updated", "not updated since the last answer");
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

function decisionItem(d, when) {
  return el("li", {"data-kind": d.kind},
            el("span", {"class": "when"}, when),
            el("span", {"class": "kind " + d.kind}, d.kind.replace("_", " ")),
            el("span", {"class": "reason"}, d.reason));
}

function renderPolledDecisions(node) {
  if (!node || !node.reachable) return;
  const items = node.decisions.slice().reverse().map(d => decisionItem(d, seconds(d.ms_ago) + " ago"));
  document.getElementById("decisions").replaceChildren(...items);
}

function follow() {
  const list = document.getElementById("decisions");
  const state = document.getElementById("stream-state");
  const source = new EventSource(api("/api/v1/decisions/stream"));
  source.onopen = () => { state.textContent = "live"; state.className = "pill live"; };
  source.onerror = () => { state.textContent = "stream: reconnecting"; state.className = "pill muted"; };
  source.addEventListener("decision", event => {
    const d = JSON.parse(event.data);
    const when = new Date(d.at).toLocaleTimeString([], {hour12: false});  // the reader's time zone
    list.prepend(decisionItem(d, when));
    while (list.children.length > MAX_DECISIONS) list.lastElementChild.remove();
  });
}

// ?stream=0: no EventSource (a headless capture waits for every open request, and a stream never ends);
// the list then shows the serving node's latest decisions from the poll.
const streaming = new URLSearchParams(location.search).get("stream") !== "0";
poll();
if (streaming) follow(); else document.getElementById("stream-state").textContent = "stream off: polled";
