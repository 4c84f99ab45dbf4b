// Line charts with axes, units, time labels and values on hover, drawn as SVG with the DOM
// (no library), and the Topic and Consumer group pages' rate charts over a chosen range
// (GET /v1/statistics/history: messages in, out, acked and redelivered per step).
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const CHART = { width: 640, height: 190, left: 56, right: 12, top: 22, bottom: 24 };
const CHART_TIME = new Intl.DateTimeFormat("sv-SE", { hour: "2-digit", minute: "2-digit", hour12: false });
const CHART_ZONE = new Intl.DateTimeFormat("en-US", { timeZoneName: "short" }).formatToParts(new Date())
  .find((p) => p.type === "timeZoneName")?.value || "";

function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
  for (const child of children) node.append(child);
  return node;
}

// A round number at or above `peak`, so the axis reads 0, 5, 10 rather than 0, 4.83, 9.67.
function niceCeiling(peak) {
  if (peak <= 0) return 1;
  const power = 10 ** Math.floor(Math.log10(peak));
  return [1, 2, 2.5, 5, 10].map((m) => m * power).find((v) => v >= peak);
}

// Three significant digits at most: 0.00833 msg/s is not "0.01", and 1234.5 is "1235".
const fmtValue = (v) => (v >= 100 ? String(Math.round(v)) : v === 0 ? "0" : String(Number(v.toPrecision(3))));

// series: [{ name, cls, values }], one value per step (already in `unit`); startMs: when the
// first step starts; stepMs: a step's length. The caption says the unit, range and zone.
function lineChart({ series, startMs, stepMs, unit, caption }) {
  const { width, height, left, right, top, bottom } = CHART;
  const points = Math.max(1, ...series.map((s) => s.values.length));
  const top_ = niceCeiling(Math.max(0, ...series.flatMap((s) => s.values)));
  const plotW = width - left - right, plotH = height - top - bottom;
  const x = (i) => left + (points > 1 ? (i * plotW) / (points - 1) : plotW / 2);
  const y = (v) => top + plotH - (v / top_) * plotH;
  const chart = svg("svg", { viewBox: `0 0 ${width} ${height}`, class: "chart", role: "img",
    "aria-label": caption });
  for (const tick of [0, top_ / 2, top_]) {  // y axis: grid lines with values and the unit
    chart.append(svg("line", { class: "grid", x1: left, x2: width - right, y1: y(tick), y2: y(tick) }),
      svg("text", { class: "tick y", x: left - 6, y: y(tick) + 4, "text-anchor": "end" }, fmtValue(tick)));
  }
  chart.append(svg("text", { class: "unit", x: 4, y: 12 }, unit));
  const labels = Math.min(points, 6);  // x axis: times of a few steps, evenly spaced
  for (let k = 0; k < labels; k++) {
    const i = labels > 1 ? Math.round((k * (points - 1)) / (labels - 1)) : 0;
    chart.append(svg("text", { class: "tick x", x: x(i), y: height - 6,
      "text-anchor": k === 0 ? "start" : k === labels - 1 ? "end" : "middle" }, CHART_TIME.format(new Date(startMs + i * stepMs))));
  }
  chart.append(svg("line", { class: "axis", x1: left, x2: width - right, y1: y(0), y2: y(0) }),
    svg("line", { class: "axis", x1: left, x2: left, y1: top, y2: y(0) }));
  for (const s of series) {
    chart.append(svg("polyline", { class: s.cls, points: s.values.map((v, i) => `${x(i)},${y(v)}`).join(" ") }));
  }
  // Hover: a cursor line at the nearest step and its time and values beside it.
  const cursor = svg("line", { class: "cursor", x1: 0, x2: 0, y1: top, y2: y(0), visibility: "hidden" });
  const tip = el("div", { class: "chart-tip", hidden: true });
  const area = svg("rect", { class: "hover", x: left, y: top, width: plotW, height: plotH, fill: "transparent" });
  chart.append(cursor, area);
  area.addEventListener("mousemove", (event) => {
    const box = chart.getBoundingClientRect();
    const at = ((event.clientX - box.left) * width) / box.width;
    const i = Math.max(0, Math.min(points - 1, Math.round(((at - left) * (points - 1)) / plotW)));
    cursor.setAttribute("x1", x(i));
    cursor.setAttribute("x2", x(i));
    cursor.setAttribute("visibility", "visible");
    const from = startMs + i * stepMs;
    tip.replaceChildren(el("div", { class: "when" }, `${fmtTime(from)} – ${CHART_TIME.format(new Date(from + stepMs))}`),
      ...series.map((s) => el("div", { class: `value ${s.cls}` }, `${s.name}: ${fmtValue(s.values[i] || 0)} ${unit}`)));
    tip.hidden = false;
    tip.style.left = `${((x(i) / width) * box.width + 12)}px`;
  });
  area.addEventListener("mouseleave", () => { tip.hidden = true; cursor.setAttribute("visibility", "hidden"); });
  const legend = el("div", { class: "legend" }, series.map((s) => el("span", { class: `key ${s.cls}` }, s.name)));
  return el("div", { class: "chart-box" }, chart, tip, legend,
    el("div", { class: "muted" }, `${caption}; times ${CHART_ZONE}`));
}

// The Overview's traffic: the broker's per-minute counts of the last hour (stats rows'
// last_hour, the current minute last), in messages per minute.
function chart(inSeries, outSeries, nowMs) {
  const minute = 60000;
  const start = Math.floor((nowMs || Date.now()) / minute) * minute - (inSeries.length - 1) * minute;
  return lineChart({ series: [{ name: "in", cls: "in", values: inSeries }, { name: "out", cls: "out", values: outSeries }],
    startMs: start, stepMs: minute, unit: "msg/min", caption: "messages per minute, last 60 minutes" });
}

const RANGES = [[60, "last hour"], [360, "last 6 hours"], [1440, "last 24 hours"]];
const RATE_KINDS = [["in", "in"], ["out", "out (delivered)"], ["acked", "acked"], ["redelivered", "redelivered"]];

// A topic's or group's rates over the range chosen (remembered per page for the session).
async function rateSection(subject, name) {
  const key = `${subject}:${name}`;
  session.chartRanges = session.chartRanges || new Map();
  const minutes = session.chartRanges.get(key) || 60;
  const history = await get(`/v1/statistics/history?${subject}=${q(name)}&minutes=${minutes}`);
  const perSecond = history.step_ms / 1000;
  const series = RATE_KINDS.filter(([kind]) => history.series[kind])
    .map(([kind, label]) => ({ name: label, cls: kind, values: history.series[kind].map((v) => v / perSecond) }));
  const step = history.step_ms / 60000;
  const picker = el("select", { name: "range", id: "rate-range", onchange: async (e) => {
    session.chartRanges.set(key, Number(e.target.value));
    try {
      const fresh = await rateSection(subject, name);
      document.getElementById("rates").replaceWith(fresh);
      clearError();
    } catch (err) { showError(err); }
  } }, RANGES.map(([m, label]) => el("option", { value: m, selected: m === minutes }, label)));
  return el("section", { id: "rates", "data-live": true }, el("h2", {}, "Rates"), field("range", picker),
    lineChart({ series, startMs: history.start_ms, stepMs: history.step_ms, unit: "msg/s",
      caption: `messages per second, ${RANGES.find(([m]) => m === minutes)?.[1] || `${minutes} min`}, ` +
        `${step === 1 ? "per minute" : `averaged over ${step} minutes`}` }));
}
