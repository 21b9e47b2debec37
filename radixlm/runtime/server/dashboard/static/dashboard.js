// radixlm dashboard: live radix tree, KV pool, requests and rates from /dashboard/events (server-sent
// events read with fetch, so the key can go in an Authorization header). Hand-written, no dependencies.
(function () {
  "use strict";
  const SVG = "http://www.w3.org/2000/svg";
  const $ = id => document.getElementById(id);
  const state = {view: null, updates: 0, zoom: null, prevNodes: {}, ghosts: []};
  window.__dash = state;  // for tests and the curious: the last view and the update count

  // ---- the key: "#key=..." once (never sent in a URL), then the session's storage -------------------
  const m = location.hash.match(/key=([^&]+)/);
  if (m) {
    sessionStorage.setItem("radixlm-key", decodeURIComponent(m[1]));
    history.replaceState(null, "", location.pathname);
  }
  function headers() {
    const key = sessionStorage.getItem("radixlm-key");
    return key ? {Authorization: "Bearer " + key} : {};
  }
  $("keyform").addEventListener("submit", ev => {
    ev.preventDefault();
    sessionStorage.setItem("radixlm-key", $("key").value);
    $("keyform").hidden = true;
    connect();
  });

  function setStatus(text, cls) { const s = $("status"); s.textContent = text; s.className = "status " + (cls || ""); }

  // ---- the event stream -----------------------------------------------------------------------------
  let generation = 0;
  async function connect() {
    const mine = ++generation;
    setStatus("connecting…");
    try {
      const res = await fetch("/dashboard/events", {headers: headers(), cache: "no-store"});
      if (res.status === 401 || res.status === 403) {
        const body = await res.json().catch(() => ({}));
        setStatus(res.status === 401 ? "key needed" : "not allowed", "error");
        $("keymsg").textContent = (body.error && body.error.message) || "the dashboard needs the admin API key";
        $("keyform").hidden = false;
        return;
      }
      if (!res.ok || !res.body) throw new Error("HTTP " + res.status);
      setStatus("live", "live");
      const reader = res.body.getReader(), dec = new TextDecoder();
      let buf = "";
      for (;;) {
        const {value, done} = await reader.read();
        if (done || mine !== generation) break;
        buf += dec.decode(value, {stream: true});
        let i;
        while ((i = buf.indexOf("\n\n")) >= 0) {
          const chunk = buf.slice(0, i); buf = buf.slice(i + 2);
          const data = chunk.split("\n").filter(l => l.startsWith("data:")).map(l => l.slice(5)).join("\n");
          if (data) update(JSON.parse(data));
        }
      }
    } catch (e) {
      setStatus("disconnected", "error");
    }
    if (mine === generation) setTimeout(connect, 1000);  // the stream ends now and then: reconnect
  }

  function update(view) {
    state.view = view;
    state.updates += 1;
    const c = view.counters;
    $("summary").textContent = `hit rate ${(100 * (c.hit_rate || 0)).toFixed(1)}% · ${c.num_requests || 0} requests · ` +
      `${c.num_forward_steps || 0} steps · ${c.num_retractions || 0} retractions · ${c.evicted_tokens || 0} tokens evicted` +
      (view.is_admin ? " · admin view (node text on hover)" : "");
    drawTree(view);
    drawPool(view);
    drawRates(view);
    drawRequests(view);
  }

  // ---- helpers --------------------------------------------------------------------------------------
  function el(tag, attrs, text) {
    const e = document.createElementNS(SVG, tag);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function svgIn(container, height) {
    container.innerHTML = "";
    const w = Math.max(300, container.clientWidth || 600);
    const s = el("svg", {width: w, height: height, viewBox: `0 0 ${w} ${height}`});
    container.appendChild(s);
    return [s, w];
  }
  const fmtS = x => x === null || x === undefined ? "–" : x < 1 ? (1000 * x).toFixed(1) + " ms" : x.toFixed(2) + " s";
  function tooltip(ev, html) {
    const t = $("tooltip");
    if (!html) { t.hidden = true; return; }
    t.innerHTML = html; t.hidden = false;
    t.style.left = Math.min(ev.clientX + 12, innerWidth - 430) + "px"; t.style.top = (ev.clientY + 12) + "px";
  }
  const esc = s => String(s).replace(/[&<>"]/g, ch => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}[ch]));

  // ---- radix tree (icicle) --------------------------------------------------------------------------
  function layoutTree(nodes) {
    const byId = {}, kids = {}, groups = {};
    nodes.forEach(n => { byId[n.id] = n; });
    nodes.forEach(n => {
      const value = n.subtree;
      if (n.parent && byId[n.parent]) (kids[n.parent] = kids[n.parent] || []).push(n);
      else { const g = `${n.rank}/${n.ns}`; (groups[g] = groups[g] || []).push(n); }
      n._value = value;
    });
    const boxes = {};
    let maxX = 1;
    function place(list, x, y0, y1, parentValue) {
      const total = list.reduce((a, n) => a + n._value, 0) || 1;
      let y = y0;
      list.forEach(n => {
        const h = (y1 - y0) * n._value / total;
        boxes[n.id] = {n, x0: x, x1: x + n.len, y0: y, y1: y + h};
        maxX = Math.max(maxX, x + n.len);
        place(kids[n.id] || [], x + n.len, y, y + h);
        y += h;
      });
    }
    const names = Object.keys(groups).sort();
    const grand = names.reduce((a, g) => a + groups[g].reduce((b, n) => b + n._value, 0), 0) || 1;
    let y = 0;
    const bands = [];
    names.forEach(g => {
      const v = groups[g].reduce((b, n) => b + n._value, 0);
      const h = v / grand;
      place(groups[g], 0, y, y + h);
      bands.push({name: g, y0: y, y1: y + h});
      y += h;
    });
    return {boxes, maxX, bands};
  }

  function nodeTip(n) {
    let s = `<b>${n.len} tokens</b> · hits ${n.hits} · lock refs ${n.lock}\n` +
      `last access ${n.age_s.toFixed(1)} s ago (tick ${n.tick})\nnamespace ${esc(n.ns)}${n.rank ? " · dp rank " + n.rank : ""}` +
      `\nsubtree ${n.subtree} tokens`;
    if (n.folded_nodes) s += `\n+${n.folded_nodes} smaller nodes folded (${n.folded_tokens} tokens, ${n.folded_hits} hits)`;
    if (n.text !== undefined) s += `<span class="txt">${esc(n.text)}${n.text_truncated ? "…" : ""}</span>`;
    else s += "\n(text: admin key only)";
    return s;
  }

  function drawTree(view) {
    const nodes = view.tree.nodes;
    const {boxes, maxX, bands} = layoutTree(nodes);
    const H = 320;
    const [svg, W] = svgIn($("tree"), H);
    const z = state.zoom && boxes[state.zoom] ? boxes[state.zoom] : null;
    const zx0 = z ? z.x0 : 0, zx1 = z ? Math.max(z.x1, subtreeMaxX(z, boxes)) : maxX;
    const zy0 = z ? z.y0 : 0, zy1 = z ? z.y1 : 1;
    $("zoomreset").hidden = !z;
    const L = 70;
    const sx = x => L + (W - L - 4) * (x - zx0) / Math.max(1, zx1 - zx0);
    const sy = y => 4 + (H - 8) * (y - zy0) / Math.max(1e-9, zy1 - zy0);
    const maxHits = Math.max(1, ...nodes.map(n => n.hits));
    if (!z) bands.forEach(b => svg.appendChild(el("text", {x: 2, y: sy((b.y0 + b.y1) / 2) + 3, class: "nslabel"}, b.name.split("/")[1])));
    const seen = {};
    Object.values(boxes).forEach(b => {
      const n = b.n;
      seen[n.id] = b;
      const x = sx(b.x0), w = sx(b.x1) - x, y = sy(b.y0), h = sy(b.y1) - y;
      if (x > W || x + w < L || y > H || y + h < 0 || w < 0.3 || h < 0.3) return;
      const heat = Math.log1p(n.hits) / Math.log1p(maxHits);
      const fill = `hsl(${140 - 20 * heat}, ${25 + 55 * heat}%, ${88 - 48 * heat}%)`;
      const cls = "node" + (n.lock ? " locked" : "") + (state.updates > 1 && !state.prevNodes[n.id] ? " new" : "");
      const r = el("rect", {x, y, width: w, height: h, fill, class: cls, "data-testid": "node", "data-id": n.id,
        "data-hits": n.hits, "data-len": n.len, "data-lock": n.lock});
      r.addEventListener("mousemove", ev => tooltip(ev, nodeTip(n)));
      r.addEventListener("mouseleave", ev => tooltip(ev, null));
      r.addEventListener("click", () => { state.zoom = n.id; drawTree(state.view); });
      svg.appendChild(r);
      if (w > 46 && h > 12) svg.appendChild(el("text", {x: x + 3, y: y + Math.min(h / 2 + 4, 14), class: "nodelabel"}, `${n.len}t · ${n.hits} hits`));
    });
    // Evicted since the last update: drawn once more where they were, fading out in red.
    const now = Date.now();
    Object.keys(state.prevNodes).forEach(id => { if (!seen[id]) state.ghosts.push({b: state.prevNodes[id], until: now + 900}); });
    state.ghosts = state.ghosts.filter(g => g.until > now);
    state.ghosts.forEach(g => {
      const x = sx(g.b.x0), w = sx(g.b.x1) - x, y = sy(g.b.y0), h = sy(g.b.y1) - y;
      if (w > 0.3 && h > 0.3) svg.appendChild(el("rect", {x, y, width: w, height: h, class: "node evicted"}));
    });
    state.prevNodes = seen;
    const t = view.tree;
    $("treeinfo").textContent = `${t.num_nodes} nodes, ${view.pool.evictable + view.pool.locked} tokens cached` +
      (t.nodes.length < t.num_nodes ? ` (showing the ${t.nodes.length} largest; smaller subtrees folded)` : "") +
      (nodes.length ? "" : " · the tree is empty");
  }
  function subtreeMaxX(b, boxes) {
    let mx = b.x1;
    Object.values(boxes).forEach(o => { if (o.y0 >= b.y0 - 1e-12 && o.y1 <= b.y1 + 1e-12 && o.x0 >= b.x0) mx = Math.max(mx, o.x1); });
    return mx;
  }
  $("zoomreset").addEventListener("click", () => { state.zoom = null; if (state.view) drawTree(state.view); });

  // ---- KV pool over time ----------------------------------------------------------------------------
  function drawPool(view) {
    const H = 170, pts = view.pool_history, p = view.pool;
    const [svg, W] = svgIn($("pool"), H);
    const T = 120, L = 4, B = 14;
    const sx = t => L + (W - L - 4) * (t + T) / T;
    const total = Math.max(1, p.total);
    const visible = pts.filter(q => q[0] >= -T);
    // The y axis ends a little above the busiest moment (a large pool would hide small usage), at most the pool.
    const busiest = Math.max(p.used + p.evictable, ...visible.map(q => q[1] + q[2]), 1);
    const ymax = Math.min(total, Math.ceil(busiest * 1.25));
    const sy = v => 4 + (H - B - 4) * (1 - Math.min(v, ymax) / ymax);
    if (visible.length) {
      const layers = [["used", q => q[1]], ["evictable", q => q[1] + q[2]], ["free", q => q[1] + q[2] + q[3]]];
      layers.reverse().forEach(([name, top]) => {
        let d = `M${sx(visible[0][0])},${sy(0)}`;
        visible.forEach(q => { d += `L${sx(q[0])},${sy(top(q))}`; });
        d += `L${sx(visible[visible.length - 1][0])},${sy(0)}Z`;
        svg.appendChild(el("path", {d, class: "area-" + name}));
      });
      for (let i = 1; i < visible.length; i++) {
        if (visible[i][5] > visible[i - 1][5]) {
          const x = sx(visible[i][0]);
          svg.appendChild(el("line", {x1: x, x2: x, y1: 4, y2: H - B, stroke: "#dc2626", "stroke-width": 2, "data-testid": "retraction"}));
        }
      }
    }
    [-120, -90, -60, -30, 0].forEach(t => svg.appendChild(el("text", {x: sx(t), y: H - 2, class: "axis", "text-anchor": t === -120 ? "start" : t === 0 ? "end" : "middle"}, t ? `${t}s` : "now")));
    svg.appendChild(el("text", {x: L + 2, y: 14, class: "axis"}, ymax < total ? `y: 0–${ymax} of ${total} slots (free above)` : `y: 0–${total} slots`));
    const pct = v => (100 * v / total).toFixed(1) + "%";
    $("poolnow").innerHTML = `<i class="sw used"></i>used <b data-testid="pool-used">${p.used}</b> (${pct(p.used)}, ${p.locked} of it locked cache)` +
      `<i class="sw evictable"></i>cached, evictable ${p.evictable} (${pct(p.evictable)})<i class="sw free"></i>free ${p.free} · total ${p.total} slots`;
  }

  // ---- rates ----------------------------------------------------------------------------------------
  function drawRates(view) {
    const H = 170, s = view.rates.series, sum = view.rates.summary;
    const [svg, W] = svgIn($("rates"), H);
    const T = 120, B = 14;
    const sx = t => 4 + (W - 8) * (t + T) / T;
    const maxTok = Math.max(1, ...s.map(q => q.tok_s));
    const syTok = v => 4 + (H - B - 8) * (1 - v / maxTok), syHit = v => 4 + (H - B - 8) * (1 - v);
    const line = (pts, cls) => { if (pts.length) svg.appendChild(el("path", {d: "M" + pts.map(q => q.join(",")).join("L"), class: cls})); };
    line(s.filter(q => q.t >= -T).map(q => [sx(q.t), syTok(q.tok_s)]), "line-tok");
    line(s.filter(q => q.t >= -T && q.hit_rate !== null).map(q => [sx(q.t), syHit(q.hit_rate)]), "line-hit");
    svg.appendChild(el("text", {x: 6, y: 14, class: "axis"}, `tokens/s (blue, max ${maxTok}) · hit rate of finished requests (green, 0–100%)`));
    [-120, -60, 0].forEach(t => svg.appendChild(el("text", {x: sx(t), y: H - 2, class: "axis", "text-anchor": t === -120 ? "start" : t === 0 ? "end" : "middle"}, t ? `${t}s` : "now")));
    const hr = sum.hit_rate_60s === null ? "–" : (100 * sum.hit_rate_60s).toFixed(1) + "%";
    $("ratetable").innerHTML =
      `<tr><th>last 60 s</th><th>p50</th><th>p90</th><th>p99</th></tr>` +
      `<tr><th>time to first token</th><td>${fmtS(sum.ttft_p50)}</td><td>${fmtS(sum.ttft_p90)}</td><td>${fmtS(sum.ttft_p99)}</td></tr>` +
      `<tr><th>inter-token latency</th><td>${fmtS(sum.itl_p50)}</td><td>${fmtS(sum.itl_p90)}</td><td>${fmtS(sum.itl_p99)}</td></tr>` +
      `<tr><th>generation</th><td colspan="3" data-testid="tok-s">${sum.tok_s_60s.toFixed(1)} tok/s</td></tr>` +
      `<tr><th>cache hit rate</th><td colspan="3">${hr} (all time ${(100 * (view.counters.hit_rate || 0)).toFixed(1)}%)</td></tr>`;
  }

  // ---- request timelines ----------------------------------------------------------------------------
  function drawRequests(view) {
    const reqs = view.requests.slice(0, 30), RH = 16, L = 250;
    const H = Math.max(40, reqs.length * RH + 18);
    const [svg, W] = svgIn($("requests"), H);
    const T = 60;
    const sx = t => L + (W - L - 8) * (Math.max(t, -T) + T) / T;
    reqs.forEach((r, i) => {
      const y = 4 + i * RH;
      const fin = r.finish ? (r.finish.type + (r.finish.type === "abort" && r.finish.message ? ": " + r.finish.message : "")) : r.state;
      svg.appendChild(el("text", {x: 2, y: y + 11, class: "rowlabel"},
        `${r.rid.slice(0, 10)} ${r.ns.slice(0, 11)} ${r.prompt}p/${r.cached}c/${r.out}o ${fin}`.slice(0, 44)));
      const g = el("g", {"data-testid": "request", "data-state": r.state, "data-rid": r.rid});
      r.segments.forEach(([kind, a, b]) => {
        if (b < -T) return;
        const x = sx(a), w = Math.max(1.5, sx(b) - x);
        g.appendChild(el("rect", {x, y: y + 2, width: w, height: RH - 5, class: "seg " + kind}));
        if (kind === "prefill" && r.prompt) {
          g.appendChild(el("rect", {x, y: y + 2, width: w * r.cached / r.prompt, height: 3, class: "seg cached"}));
        }
      });
      r.marks.forEach(([kind, t]) => {
        if (t < -T) return;
        const x = sx(t);
        g.appendChild(el("path", {d: kind === "retraction" ? `M${x - 4},${y}L${x + 4},${y}L${x},${y + 6}Z` : `M${x - 4},${y + RH - 2}L${x + 4},${y + RH - 2}L${x},${y + RH - 8}Z`,
          class: kind === "retraction" ? "mk-r" : "mk-j"}));
      });
      g.addEventListener("mousemove", ev => tooltip(ev, `<b>${esc(r.rid)}</b> · ${esc(r.ns)} · ${esc(fin)}\nprompt ${r.prompt} tokens (${r.cached} cached) · out ${r.out}\n` +
        r.segments.map(([k, a, b]) => `${k}: ${fmtS(b - a)}`).join("\n")));
      g.addEventListener("mouseleave", ev => tooltip(ev, null));
      svg.appendChild(g);
    });
    [-60, -45, -30, -15, 0].forEach(t => svg.appendChild(el("text", {x: sx(t), y: H - 2, class: "axis", "text-anchor": t === 0 ? "end" : "middle"}, t ? `${t}s` : "now")));
    if (!reqs.length) svg.appendChild(el("text", {x: L, y: 20, class: "axis"}, "no requests yet"));
  }

  connect();
})();
