// A graphviz SVG with fit-to-view, pan, zoom and search (pypto.viz.graph_widget.GraphWidget), an
// anywidget module shipped inside the package (no CDN).
//
//   opened / fit     the whole graph in view (never enlarged past 100%)
//   drag             pan                      Ctrl/Alt + wheel  zoom around the pointer
//   + / - / 100%     zoom buttons             search box        nodes whose text has it are marked,
//                                                               Enter centres the next one
// The model's `svg` is the drawing, `query` the search (both ways), `zoom` the scale shown.

const VIEW_H = 520;

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function render({ model, el: root }) {
  root.classList.add("pypto-gv");
  const bar = el("div", "pypto-gv-bar");
  const search = el("input", "pypto-gv-search");
  search.type = "search"; search.placeholder = "search ops, e.g. exp";
  const count = el("span", "pypto-gv-count");
  const zin = el("button", "pypto-gv-btn", "+"), zout = el("button", "pypto-gv-btn", "\u2212");
  const fit = el("button", "pypto-gv-btn", "fit"), one = el("button", "pypto-gv-btn", "100%");
  const scale = el("span", "pypto-gv-scale");
  bar.append(search, count, zin, zout, fit, one, scale);
  const view = el("div", "pypto-gv-view");
  const stage = el("div", "pypto-gv-stage");
  view.append(stage);
  root.append(bar, view);

  let svg = null, w = 1, h = 1, s = 1, tx = 0, ty = 0, hits = [], at = -1;
  let touched = false;          // the user zoomed or panned: a resize keeps their view

  function apply() {
    stage.style.transform = `translate(${tx}px, ${ty}px) scale(${s})`;
    scale.textContent = Math.round(s * 100) + "%";
  }
  function sync() { model.set("zoom", Math.round(s * 1000) / 1000); model.save_changes(); }
  function viewW() { return Math.max(view.clientWidth || 800, 100); }
  function viewH() { return Math.max(view.clientHeight || VIEW_H, 100); }

  function fitView() {
    s = Math.min(viewW() / w, viewH() / h, 1);
    tx = (viewW() - w * s) / 2; ty = Math.max((viewH() - h * s) / 2, 0);
    apply(); sync();
  }
  function zoomAt(f, cx, cy) {
    touched = true;
    const ns = Math.min(Math.max(s * f, 0.05), 8);
    tx = cx - (cx - tx) * ns / s; ty = cy - (cy - ty) * ns / s; s = ns;
    apply(); sync();
  }

  function load() {
    stage.innerHTML = model.get("svg") || "";
    svg = stage.querySelector("svg");
    if (!svg) { count.textContent = ""; return; }
    w = svg.width.baseVal.value || 800; h = svg.height.baseVal.value || 600;
    svg.style.display = "block";
    view.style.height = Math.min(VIEW_H, Math.max(h + 8, 160)) + "px";
    mark();
    touched = false;
    fitView();
  }

  function mark() {
    const q = (model.get("query") || "").trim().toLowerCase();
    hits = [];
    at = -1;
    if (!svg) return;
    for (const g of svg.querySelectorAll("g.node")) {
      const text = [...g.querySelectorAll("text")].map((t) => t.textContent).join(" ").toLowerCase();
      const hit = q !== "" && text.includes(q);
      g.classList.toggle("pypto-gv-hit", hit);
      g.classList.toggle("pypto-gv-dim", q !== "" && !hit);
      if (hit) hits.push(g);
    }
    count.textContent = q === "" ? "" : `${hits.length} node${hits.length === 1 ? "" : "s"}`;
    if (search.value !== (model.get("query") || "")) search.value = model.get("query") || "";
  }

  function next() {
    if (!hits.length) return;
    at = (at + 1) % hits.length;
    const r = hits[at].getBoundingClientRect(), v = view.getBoundingClientRect();
    tx += v.left + viewW() / 2 - (r.left + r.width / 2);
    ty += v.top + viewH() / 2 - (r.top + r.height / 2);
    apply();
  }

  let drag = null;
  view.addEventListener("mousedown", (e) => { drag = { x: e.clientX, y: e.clientY, tx, ty }; view.classList.add("grab"); });
  const up = () => { drag = null; view.classList.remove("grab"); };
  window.addEventListener("mouseup", up);
  view.addEventListener("mousemove", (e) => {
    if (!drag) return;
    tx = drag.tx + e.clientX - drag.x; ty = drag.ty + e.clientY - drag.y;
    touched = true;
    apply();
  });
  view.addEventListener("wheel", (e) => {
    const r = view.getBoundingClientRect();
    if (e.ctrlKey || e.altKey || e.metaKey) {
      e.preventDefault();
      zoomAt(Math.exp(-e.deltaY * 0.002), e.clientX - r.left, e.clientY - r.top);
    } else if (h * s > viewH()) {             // a tall graph: the wheel scrolls it
      const nty = Math.min(Math.max(ty - e.deltaY, viewH() - h * s), 0);
      if (nty !== ty) { e.preventDefault(); ty = nty; apply(); }
    }
  }, { passive: false });
  view.addEventListener("dblclick", fitView);
  zin.onclick = () => zoomAt(1.25, viewW() / 2, viewH() / 2);
  zout.onclick = () => zoomAt(0.8, viewW() / 2, viewH() / 2);
  fit.onclick = () => { touched = false; fitView(); };
  one.onclick = () => zoomAt(1 / s, viewW() / 2, viewH() / 2);
  search.addEventListener("input", () => { model.set("query", search.value); model.save_changes(); mark(); });
  search.addEventListener("keydown", (e) => { if (e.key === "Enter") next(); });

  const onSvg = () => load();
  const onQuery = () => mark();
  model.on("change:svg", onSvg);
  model.on("change:query", onQuery);
  // shown later (a hidden tab has no size): fit once it has one, unless the user moved it
  let lastW = 0;
  const ro = new ResizeObserver(() => {
    const cw = view.clientWidth;
    if (cw > 0 && Math.abs(cw - lastW) > 1) { lastW = cw; if (!touched && svg) fitView(); }
  });
  ro.observe(view);
  load();
  return () => {
    ro.disconnect();
    window.removeEventListener("mouseup", up);
    model.off("change:svg", onSvg);
    model.off("change:query", onQuery);
  };
}

export default { render };
