// The interactive tile timeline (pypto.viz.timeline_widget.TimelineWidget), an anywidget module.
// Shipped inside the package: no CDN, works offline.  The model's `data` is
// pypto.viz.timeline.timeline_data(...): runs of rows (core, pipe) and bars as columns.
//
//   wheel            scroll the rows (every core: 48+ cores scroll)
//   Ctrl/Alt + wheel zoom the cycle axis around the pointer     + / - / fit buttons, double-click: fit
//   drag             pan the cycle axis
//   hover            the instruction: op, core, pipe, cycles, task, kernel line
//   click            select it (the model's `selected`: Python shows its PTO and source line)
// `view` ([first, last] cycle shown) follows zoom and pan both ways.

const LABEL_W = 96, ROW_H = 14, RUN_H = 18, AXIS_H = 26, MAX_H = 460;

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function niceStep(span, target) {
  const raw = Math.max(span / Math.max(target, 1), 1);
  const k = Math.pow(10, Math.floor(Math.log10(raw)));
  for (const m of [1, 2, 5, 10]) if (m * k >= raw) return m * k;
  return 10 * k;
}

function column(v) {
  // a bar column: a binary buffer of float64 (a DataView from the widget), or a plain list
  if (v instanceof DataView) return new Float64Array(v.buffer, v.byteOffset, v.byteLength / 8);
  if (v instanceof ArrayBuffer) return new Float64Array(v);
  return v;
}

function layout(data) {
  // y of every row of every run; per row the bars sorted by start (a pipe runs in order)
  const runs = data.runs.map((run) => ({
    ...run, events: Object.fromEntries(Object.entries(run.events).map(([k, v]) => [k, column(v)])) }));
  let y = 0;
  const showHeads = runs.length > 1 || runs.some((r) => r.label);
  for (const run of runs) {
    run.y0 = y;
    if (showHeads) y += RUN_H;
    run.rowY = run.rows.map((_, k) => y + k * ROW_H);
    y += run.rows.length * ROW_H;
    const ev = run.events, n = ev.row.length;
    run.byRow = run.rows.map(() => []);
    for (let i = 0; i < n; i++) run.byRow[ev.row[i]].push(i);
    for (const list of run.byRow) list.sort((a, b) => ev.start[a] - ev.start[b]);
    run.critical = new Set(run.critical);
    y += 6;
  }
  return { runs, height: Math.max(y, ROW_H), showHeads };
}

function firstEnding(list, ends, t) {
  // index into `list` of the first bar whose end >= t (ends grow along a row)
  let lo = 0, hi = list.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (ends[list[mid]] < t) lo = mid + 1; else hi = mid;
  }
  return lo;
}

function render({ model, el: root }) {
  root.classList.add("pypto-tl");
  const bar = el("div", "pypto-tl-bar");
  const title = el("span", "pypto-tl-title");
  const range = el("span", "pypto-tl-range");
  const zin = el("button", "pypto-tl-btn", "+"), zout = el("button", "pypto-tl-btn", "\u2212");
  const fit = el("button", "pypto-tl-btn", "fit");
  zin.title = "zoom in (Ctrl + wheel)"; zout.title = "zoom out"; fit.title = "the whole run (double-click)";
  const crit = el("label", "pypto-tl-opt"), critBox = el("input");
  critBox.type = "checkbox"; crit.append(critBox, " critical path");
  const deps = el("label", "pypto-tl-opt"), depsBox = el("input");
  depsBox.type = "checkbox"; deps.append(depsBox, " dependencies");
  bar.append(title, zin, zout, fit, crit, deps, range);
  const scroller = el("div", "pypto-tl-scroll");
  const canvas = el("canvas", "pypto-tl-canvas");
  scroller.append(canvas);
  const axis = el("canvas", "pypto-tl-axis");
  const legend = el("div", "pypto-tl-legend");
  const tip = el("div", "pypto-tl-tip");
  tip.style.display = "none";
  root.append(bar, scroller, axis, legend, tip);

  let L = null, v0 = 0, v1 = 1, end = 1, selected = null, width = 800, frame = 0;

  function plotW() { return Math.max(width - LABEL_W - 8, 50); }
  function xOf(t) { return LABEL_W + (t - v0) * plotW() / Math.max(v1 - v0, 1e-9); }
  function tOf(x) { return v0 + (x - LABEL_W) * (v1 - v0) / plotW(); }

  function load() {
    const data = model.get("data") || { runs: [], classes: [], end: 1 };
    L = layout(data);
    L.classes = data.classes;
    end = Math.max(data.end || 1, 1);
    title.textContent = data.runs.map((r) => (r.label ? r.label + ": " : "") + r.title).join("  |  ");
    const used = new Set();
    for (const run of L.runs) for (const c of run.events.cls) used.add(c);
    legend.replaceChildren(...data.classes.filter((_, k) => used.has(k)).map(([name, color]) => {
      const item = el("span", "pypto-tl-key");
      const sw = el("i"); sw.style.background = color;
      item.append(sw, name);
      return item;
    }));
    const hidden = data.runs.reduce((s, r) => s + (r.hidden_cores || 0), 0);
    if (hidden) legend.append(el("span", "pypto-tl-note", `(${hidden} more cores not shown: too many bars)`));
    const v = model.get("view");
    if (v && v.length === 2 && v[1] > v[0]) { v0 = v[0]; v1 = v[1]; } else { v0 = 0; v1 = end; }
    selected = null;
    resize();
  }

  function setView(a, b, sync = true) {
    const span = Math.min(Math.max(b - a, 4), end * 1.05);
    a = Math.max(Math.min(a, end - span * 0.05), -span * 0.05);
    v0 = a; v1 = a + span;
    draw();
    if (sync) {
      clearTimeout(frame);
      frame = setTimeout(() => { model.set("view", [Math.round(v0), Math.round(v1)]); model.save_changes(); }, 120);
    }
  }

  function resize() {
    width = Math.max(root.clientWidth || 800, 300);
    const dpr = window.devicePixelRatio || 1;
    canvas.width = width * dpr; canvas.height = L.height * dpr;
    canvas.style.width = width + "px"; canvas.style.height = L.height + "px";
    scroller.style.maxHeight = MAX_H + "px";
    axis.width = width * dpr; axis.height = AXIS_H * dpr;
    axis.style.width = width + "px"; axis.style.height = AXIS_H + "px";
    draw();
  }

  function draw() {
    if (!L) return;
    const dpr = window.devicePixelRatio || 1;
    const g = canvas.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, width, L.height);
    g.font = "10px Helvetica, Arial, sans-serif";
    g.textBaseline = "middle";
    const critical = critBox.checked;
    const step = niceStep(v1 - v0, 8);
    for (const run of L.runs) {
      if (L.showHeads) {
        g.fillStyle = "#333"; g.font = "bold 11px Helvetica, Arial, sans-serif";
        g.fillText((run.label ? run.label + ": " : "") + run.title, 4, run.y0 + RUN_H / 2);
        g.font = "10px Helvetica, Arial, sans-serif";
      }
      const ev = run.events;
      run.rows.forEach(([core, pipe], r) => {
        const y = run.rowY[r];
        if (r % 2) { g.fillStyle = "#f6f6f6"; g.fillRect(LABEL_W, y, plotW(), ROW_H); }
        g.fillStyle = "#333"; g.textAlign = "right";
        g.fillText(core + " " + pipe, LABEL_W - 6, y + ROW_H / 2);
        g.textAlign = "left";
        g.save();
        g.beginPath(); g.rect(LABEL_W, y, plotW(), ROW_H); g.clip();     // bars never cover the labels
        const list = run.byRow[r];
        for (let k = firstEnding(list, ev.end, v0); k < list.length; k++) {
          const i = list[k];
          if (ev.start[i] > v1) break;
          const x = xOf(ev.start[i]), w = Math.max(xOf(ev.end[i]) - x, 0.8);
          const dim = critical && !run.critical.has(ev.task[i]);
          g.globalAlpha = dim ? 0.18 : 1;
          g.fillStyle = L.classes[ev.cls[i]][1];
          g.fillRect(x, y + 2, w, ROW_H - 4);
          if (w > 3) { g.fillStyle = "#fff"; g.fillRect(x + w - 0.5, y + 2, 0.5, ROW_H - 4); }
        }
        g.globalAlpha = 1;
        g.restore();
      });
      if (depsBox.checked) {
        g.save();
        g.beginPath(); g.rect(LABEL_W, 0, plotW(), L.height); g.clip();
        g.strokeStyle = "rgba(60,60,60,0.55)"; g.lineWidth = 1;
        for (const [ra, ta, rb, tb] of run.arrows) {
          const xa = xOf(ta), ya = run.rowY[ra] + ROW_H / 2, xb = xOf(tb), yb = run.rowY[rb] + ROW_H / 2;
          g.beginPath(); g.moveTo(xa, ya); g.lineTo(xb, yb); g.stroke();
          const an = Math.atan2(yb - ya, xb - xa);
          g.beginPath(); g.moveTo(xb, yb);
          g.lineTo(xb - 5 * Math.cos(an - 0.4), yb - 5 * Math.sin(an - 0.4));
          g.lineTo(xb - 5 * Math.cos(an + 0.4), yb - 5 * Math.sin(an + 0.4));
          g.closePath(); g.fillStyle = "rgba(60,60,60,0.7)"; g.fill();
        }
        g.restore();
      }
    }
    // grid
    g.strokeStyle = "#ddd"; g.setLineDash([2, 2]);
    for (let c = Math.ceil(v0 / step) * step; c <= v1; c += step) {
      const x = xOf(c); g.beginPath(); g.moveTo(x, 0); g.lineTo(x, L.height); g.stroke();
    }
    g.setLineDash([]);
    if (selected) {
      const run = L.runs[selected.run], ev = run.events, i = selected.i;
      const x = xOf(ev.start[i]), w = Math.max(xOf(ev.end[i]) - x, 0.8), y = run.rowY[ev.row[i]];
      g.strokeStyle = "#000"; g.lineWidth = 2; g.strokeRect(x - 1, y + 1, w + 2, ROW_H - 2);
    }
    // axis
    const a = axis.getContext("2d");
    a.setTransform(dpr, 0, 0, dpr, 0, 0);
    a.clearRect(0, 0, width, AXIS_H);
    a.font = "10px Helvetica, Arial, sans-serif"; a.fillStyle = "#333"; a.textAlign = "center";
    a.strokeStyle = "#333"; a.beginPath(); a.moveTo(LABEL_W, 0.5); a.lineTo(LABEL_W + plotW(), 0.5); a.stroke();
    for (let c = Math.ceil(v0 / step) * step; c <= v1; c += step) {
      const x = xOf(c);
      a.beginPath(); a.moveTo(x, 0); a.lineTo(x, 4); a.stroke();
      a.fillText(String(c), x, 14);
    }
    a.textAlign = "right"; a.fillText("cycles", LABEL_W - 6, 14);
    range.textContent = `cycles ${Math.round(Math.max(v0, 0))}\u2013${Math.round(Math.min(v1, end))} of ${end}`;
  }

  function hit(evt) {
    // the bar under the pointer: {run, i} or null
    const rect = canvas.getBoundingClientRect();
    const x = evt.clientX - rect.left, y = evt.clientY - rect.top;
    if (!L || x < LABEL_W) return null;
    const t = tOf(x), slack = (v1 - v0) / plotW() * 2;      // 2 px
    for (let ri = 0; ri < L.runs.length; ri++) {
      const run = L.runs[ri];
      const r = Math.floor((y - (run.rowY[0] ?? 0)) / ROW_H);
      if (r < 0 || r >= run.rows.length) continue;
      const ev = run.events, list = run.byRow[r];
      for (let k = firstEnding(list, ev.end, t - slack); k < list.length; k++) {
        const i = list[k];
        if (ev.start[i] > t + slack) break;
        return { run: ri, i };
      }
    }
    return null;
  }

  function describe(h) {
    const run = L.runs[h.run], ev = run.events, i = h.i, [core, pipe] = run.rows[ev.row[i]];
    const line = run.lines[ev.line[i]];
    return `${run.label ? run.label + ": " : ""}${run.ops[ev.op[i]]} on ${core} ${pipe}: cycles ${ev.start[i]}\u2013` +
      `${ev.end[i]} (${ev.end[i] - ev.start[i]}), task ${ev.task[i]} instruction ${ev.index[i]}` +
      (ev.ready[i] >= 0 ? `, data ready at ${ev.ready[i]}` : "") + (line ? `, line ${line}` : "");
  }

  let drag = null;
  canvas.addEventListener("mousedown", (e) => { drag = { x: e.clientX, v0, v1, moved: false }; });
  window.addEventListener("mouseup", onUp);
  function onUp(e) {
    if (!drag) return;
    const d = drag; drag = null;
    if (!d.moved && e.target === canvas) {
      const h = hit(e);
      selected = h;
      if (h) {
        const run = L.runs[h.run], ev = run.events, i = h.i, [core, pipe] = run.rows[ev.row[i]];
        model.set("selected", { run: h.run, label: run.label, task: ev.task[i], index: ev.index[i], op: run.ops[ev.op[i]],
                                core, pipe, start: ev.start[i], end: ev.end[i], line: run.lines[ev.line[i]] });
      } else {
        model.set("selected", {});
      }
      model.save_changes();
      draw();
    }
  }
  canvas.addEventListener("mousemove", (e) => {
    if (drag) {
      const dx = e.clientX - drag.x;
      if (Math.abs(dx) > 2) drag.moved = true;
      if (drag.moved) {
        const dt = dx * (drag.v1 - drag.v0) / plotW();
        setView(drag.v0 - dt, drag.v1 - dt);
      }
      tip.style.display = "none";
      return;
    }
    const h = hit(e);
    if (!h) { tip.style.display = "none"; return; }
    tip.textContent = describe(h);
    const box = root.getBoundingClientRect();
    tip.style.left = Math.min(e.clientX - box.left + 12, width - 260) + "px";
    tip.style.top = (e.clientY - box.top + 14) + "px";
    tip.style.display = "block";
  });
  canvas.addEventListener("mouseleave", () => { tip.style.display = "none"; });
  canvas.addEventListener("wheel", (e) => {
    if (!(e.ctrlKey || e.altKey || e.metaKey)) return;      // plain wheel: scroll the rows
    e.preventDefault();
    const rect = canvas.getBoundingClientRect();
    const t = tOf(e.clientX - rect.left), f = Math.exp(e.deltaY * 0.002);
    setView(t - (t - v0) * f, t + (v1 - t) * f);
  }, { passive: false });
  canvas.addEventListener("dblclick", () => setView(0, end));
  zin.onclick = () => { const m = (v0 + v1) / 2, s = (v1 - v0) / 4; setView(m - s, m + s); };
  zout.onclick = () => { const m = (v0 + v1) / 2, s = (v1 - v0); setView(m - s, m + s); };
  fit.onclick = () => setView(0, end);
  critBox.onchange = draw;
  depsBox.onchange = draw;

  const onData = () => load();
  const onView = () => {
    const v = model.get("view");
    if (v && v.length === 2 && v[1] > v[0] && (Math.round(v0) !== v[0] || Math.round(v1) !== v[1])) setView(v[0], v[1], false);
  };
  model.on("change:data", onData);
  model.on("change:view", onView);
  const ro = new ResizeObserver(() => { if (L && Math.abs((root.clientWidth || width) - width) > 1) resize(); });
  ro.observe(root);
  load();
  return () => {
    ro.disconnect();
    window.removeEventListener("mouseup", onUp);
    model.off("change:data", onData);
    model.off("change:view", onView);
  };
}

export default { render };
