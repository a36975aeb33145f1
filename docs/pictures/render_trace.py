"""Renders a jdtensor trace (``jdtensor launch --trace FILE``) as a picture,
in a real browser: a small self-contained viewer page (the trace inside it,
drawn on a canvas: one track per client, its phases as slices, the verdicts,
stragglers and the launcher's lines as markers, its CPU use as a line), and
headless Chromium's screenshot of it. For the guides' pictures; Perfetto
(https://ui.perfetto.dev) is the viewer for people.

    python docs/pictures/render_trace.py run.json out.png [--title TEXT] [--width 1400]

Needs Chromium (``apt-get install chromium``); writes ``out.html`` beside the
picture too.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys

_PAGE = r"""<!doctype html>
<html><head><meta charset="utf-8"><title>__TITLE__</title>
<style>
 body { margin: 0; font: 13px sans-serif; background: #fff; color: #222; }
 h1 { font-size: 15px; margin: 10px 14px 2px; }
 #legend { margin: 0 14px 6px; }
 #legend span { display: inline-block; margin-right: 14px; }
 #legend i { display: inline-block; width: 12px; height: 12px; margin-right: 4px;
             vertical-align: -2px; }
</style></head>
<body><h1>__TITLE__</h1><div id="legend"></div><canvas id="c"></canvas>
<script>
const trace = __TRACE__;
const COLORS = {"set-up": "#9e9e9e", "own code": "#43a047", "in JAX": "#1e88e5",
                "in a collective": "#fb8c00", "at a service wait": "#00897b",
                "at exit": "#8e24aa"};
const ev = trace.traceEvents;
const names = {}, sort = {};
for (const e of ev) {
  if (e.ph === "M" && e.name === "process_name") names[e.pid] = e.args.name;
  if (e.ph === "M" && e.name === "process_sort_index") sort[e.pid] = e.args.sort_index;
}
const pids = Object.keys(names).map(Number).sort((a, b) => (sort[a] ?? 0) - (sort[b] ?? 0));
let t0 = Infinity, t1 = -Infinity;
for (const e of ev) if (e.ts !== undefined) { t0 = Math.min(t0, e.ts); t1 = Math.max(t1, e.ts + (e.dur || 0)); }
const slices = {}, instants = {}, cpu = {}, open = {};
for (const e of ev) {
  const p = e.pid;
  if (e.ph === "B") (open[p] = open[p] || []).push(e);
  else if (e.ph === "E" && open[p] && open[p].length) {
    const b = open[p].pop(); (slices[p] = slices[p] || []).push([b.ts, e.ts, b.name]);
  } else if (e.ph === "X") (slices[p] = slices[p] || []).push([e.ts, e.ts + e.dur, e.name]);
  else if (e.ph === "i") (instants[p] = instants[p] || []).push(e);
  else if (e.ph === "C" && e.name === "cpu %") (cpu[p] = cpu[p] || []).push([e.ts, e.args["cpu %"]]);
}
// The verdict's, the stragglers' and the launcher's words, once each, under
// the tracks, numbered as their markers are.
const notes = [], said = {};
for (const e of ev) if (e.ph === "i" && (e.name === "verdict" || e.s === "g" ||
                                         e.name === "straggler")) {
  const text = ((e.args && e.args.text) || e.name).replace(/^heartbeat: /, "");
  if (!(text in said)) { said[text] = notes.length + 1; notes.push(text); }
  e.note = said[text];
}
const W = __WIDTH__, LABEL = 230, RIGHT = 30, TRACK = 46, TOP = 28;
const H = TOP + pids.length * TRACK + 40;
const c = document.getElementById("c"); c.width = W; c.height = H + notes.length * 17 + 8;
const g = c.getContext("2d");
const x = ts => LABEL + (ts - t0) / (t1 - t0) * (W - LABEL - RIGHT);
g.font = "12px sans-serif";
// The time axis, in seconds from the first event.
const span = (t1 - t0) / 1e6, step = span > 60 ? 10 : span > 20 ? 5 : span > 8 ? 2 : 1;
g.strokeStyle = "#ddd"; g.fillStyle = "#666";
for (let s = 0; s <= span; s += step) {
  const X = x(t0 + s * 1e6); g.beginPath(); g.moveTo(X, TOP - 6); g.lineTo(X, H - 30); g.stroke();
  g.fillText(s + " s", X - 8, H - 14);
}
pids.forEach((pid, row) => {
  const y = TOP + row * TRACK;
  g.fillStyle = "#222"; g.fillText(names[pid], 8, y + 18);
  for (const [a, b, name] of (slices[pid] || [])) {
    g.fillStyle = COLORS[name] || "#bbb";
    g.fillRect(x(a), y + 6, Math.max(1, x(b) - x(a)), 18);
  }
  const pts = cpu[pid] || [];
  if (pts.length) {  // CPU use, 0-100%, under the slices: each value holds
    // until the next (a counter is written when it moves).
    const last = Math.max(...(slices[pid] || [[0, pts[pts.length - 1][0]]]).map(s => s[1]));
    g.strokeStyle = "#546e7a"; g.beginPath();
    let Y = 0;
    pts.forEach(([ts, v], i) => {
      if (i) g.lineTo(x(ts), Y);
      Y = y + 40 - Math.min(v, 100) / 100 * 12;
      if (i) g.lineTo(x(ts), Y); else g.moveTo(x(ts), Y); });
    g.lineTo(x(Math.max(last, pts[pts.length - 1][0])), Y);
    g.stroke();
  }
  for (const e of (instants[pid] || [])) {
    const X = x(e.ts);
    if (e.s === "g") {  // A launcher line across the whole picture.
      g.strokeStyle = "#c62828"; g.setLineDash([4, 3]); g.beginPath();
      g.moveTo(X, TOP - 6); g.lineTo(X, H - 30); g.stroke(); g.setLineDash([]);
      g.fillStyle = "#c62828"; g.fillText(String(e.note), X + 3, TOP - 8);
      continue;
    }
    g.fillStyle = e.name === "verdict" ? "#c62828" : e.name === "straggler" ? "#f9a825"
        : "#37474f";
    g.beginPath(); g.moveTo(X, y + 4); g.lineTo(X - 5, y - 4); g.lineTo(X + 5, y - 4); g.fill();
    if (e.note) g.fillText(String(e.note), X + 6, y + 2);
  }
});
g.fillStyle = "#222";
notes.forEach((text, i) => {
  let t = `${i + 1}. ${text}`;
  while (g.measureText(t).width > W - 20 && t.length > 10) t = t.slice(0, -2);
  if (t.length < `${i + 1}. ${text}`.length) t = t.slice(0, -1) + "…";
  g.fillText(t, 10, H + 4 + i * 17);
});
const legend = document.getElementById("legend");
for (const [name, color] of Object.entries(COLORS))
  legend.innerHTML += `<span><i style="background:${color}"></i>${name}</span>`;
legend.innerHTML += `<span><i style="background:#c62828"></i>verdict / launcher line</span>` +
                    `<span><i style="background:#f9a825"></i>straggler</span>` +
                    `<span><i style="background:#546e7a;height:2px;vertical-align:3px"></i>CPU %</span>`;
</script></body></html>
"""


def page(trace: dict, title: str, width: int) -> str:
  return (_PAGE.replace("__TRACE__", json.dumps(trace))
          .replace("__TITLE__", title).replace("__WIDTH__", str(width)))


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("trace")
  parser.add_argument("out")
  parser.add_argument("--title", default="jdtensor launch --trace")
  parser.add_argument("--width", type=int, default=1400)
  args = parser.parse_args(argv)
  with open(args.trace, encoding="utf-8") as f:
    trace = json.load(f)
  events = trace["traceEvents"]
  tracks = sum(e["ph"] == "M" and e["name"] == "process_name" for e in events)
  notes = {((e.get("args") or {}).get("text") or e["name"]).removeprefix("heartbeat: ")
           for e in events if e["ph"] == "i"
           and (e["name"] in ("verdict", "straggler") or e.get("s") == "g")}
  height = 80 + 28 + tracks * 46 + 40 + len(notes) * 17 + 8
  html = os.path.splitext(os.path.abspath(args.out))[0] + ".html"
  with open(html, "w", encoding="utf-8") as f:
    f.write(page(trace, args.title, args.width))
  browser = next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome")
                  if shutil.which(b)), None)
  if browser is None:
    print(f"render_trace: no Chromium here (apt-get install chromium); the page is {html}",
          file=sys.stderr)
    return 1
  subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                  "--hide-scrollbars", f"--window-size={args.width},{height}",
                  f"--screenshot={os.path.abspath(args.out)}", f"file://{html}"],
                 check=True, timeout=120, capture_output=True)
  print(f"render_trace: {args.out} (and {html})")
  return 0


if __name__ == "__main__":
  sys.exit(main())
