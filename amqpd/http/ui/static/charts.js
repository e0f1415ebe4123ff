// Rate and length charts over uPlot (vendor/uplot, loaded by index.html as window.uPlot).
//
// The history comes from the server (RabbitMQ's `samples`: counts or lengths, newest first):
// ten minutes of the node's for the overview, the last minute of a queue's, channel's or
// connection's for its page, so a chart opens full. A chart is fed rows of
// [unix seconds, value per series...] and redraws in place.

import { h } from "./ui.js";

const COLOURS = ["#2b6cb0", "#2f855a", "#b7791f", "#805ad5", "#c53030", "#4a5568"];

export class Chart {
  constructor(container, names, { unit = "/s", height = 180, id } = {}) {
    this.names = names;
    this.el = h("div", { class: "chart", id, dataset: { points: "0" } });
    container.append(this.el);
    const width = Math.max(Math.min(container.clientWidth || 600, 1400) - 20, 300);
    const opts = {
      width, height,
      legend: { live: false },
      cursor: { show: false },
      scales: { x: { time: true, auto: false }, y: { range: (u, min, max) => [0, Math.max(max * 1.1, 1)] } },
      // time labels at least 80 px apart (uPlot's default 40 px overlaps "3:38am3:39am"),
      // as 24-hour clock times, with seconds only when ticks are less than a minute apart
      axes: [{ space: 80, values: (u, ticks, axis, space, incr) => ticks.map((t) => fmtClock(t, incr < 60)) },
        { values: (u, ticks) => ticks.map((v) => `${fmtShort(v)}${unit}`), size: 70 }],
      series: [{}, ...names.map((n, i) => ({ label: n, stroke: COLOURS[i % COLOURS.length], width: 2, points: { show: false } }))],
    };
    this.plot = new window.uPlot(opts, [[], ...names.map(() => [])], this.el);
    this.el.uplot = this.plot;  // for tests that check what the canvas shows (axis labels)
    this.last = [];
  }

  // rows: [[t_seconds, v1, v2, ...], ...] oldest first
  set(rows) {
    const data = [rows.map((r) => r[0]), ...this.names.map((_, i) => rows.map((r) => r[i + 1]))];
    this.plot.setData(data);
    // the time axis: at least a minute wide, ending at the newest point (or now)
    const last = rows.length ? rows[rows.length - 1][0] : Date.now() / 1000;
    const first = rows.length ? rows[0][0] : last;
    this.plot.setScale("x", { min: Math.min(first, last - 60), max: last });
    this.el.dataset.points = String(rows.length);
    this.last = rows.length ? rows[rows.length - 1].slice(1) : [];
    // the latest values, readable without the canvas (for people and for tests)
    this.el.dataset.latest = JSON.stringify(this.last);
    this.el.dataset.newest = rows.length ? String(rows[rows.length - 1][0]) : "";
    this.el.dataset.max = String(Math.max(0, ...rows.flatMap((r) => r.slice(1))));
  }

  destroy() { this.plot.destroy(); }
}

function fmtClock(seconds, withSeconds) {
  const d = new Date(seconds * 1000);
  const two = (n) => String(n).padStart(2, "0");
  return `${two(d.getHours())}:${two(d.getMinutes())}${withSeconds ? `:${two(d.getSeconds())}` : ""}`;
}

function fmtShort(v) {
  if (v >= 1e6) return `${(v / 1e6).toFixed(1)}M`;
  if (v >= 1e3) return `${(v / 1e3).toFixed(1)}k`;
  return v % 1 ? v.toFixed(1) : String(v);
}

// the samples of several RabbitMQ-shaped details, and how many points all of them have;
// a series the object does not count at all (no details, say a channel's redeliveries)
// is drawn as zero rather than hiding the others
function sampleSeries(detailsList) {
  const series = detailsList.map((d) => (d && d.samples ? d.samples : null));
  const present = series.filter((s) => s !== null);
  const n = present.length ? Math.min(...present.map((s) => s.length)) : 0;
  const base = present[0];
  const value = (s, i) => (s === null ? 0 : s[i].sample);
  return { series, n, base, value };
}

// RabbitMQ-shaped details {samples:[{sample, timestamp}] newest first} for several
// series -> rate rows, oldest first, one per interval between samples
export function ratesFromSamples(detailsList) {
  const { series, n, base, value } = sampleSeries(detailsList);
  const rows = [];
  for (let i = n - 2; i >= 0; i--) {
    const t = base[i].timestamp, dt = (t - base[i + 1].timestamp) / 1000;
    if (dt <= 0) continue;
    rows.push([t / 1000, ...series.map((s) => Math.max(value(s, i) - value(s, i + 1), 0) / dt)]);
  }
  return rows;
}

export function lengthsFromSamples(detailsList) {
  const { series, n, base, value } = sampleSeries(detailsList);
  const rows = [];
  for (let i = n - 1; i >= 0; i--) rows.push([base[i].timestamp / 1000, ...series.map((s) => value(s, i))]);
  return rows;
}

// the query that asks the API for an object's last minute of samples (RabbitMQ's own)
export const LAST_MINUTE = "?msg_rates_age=60&msg_rates_incr=5&lengths_age=60&lengths_incr=5&data_rates_age=60&data_rates_incr=5";
