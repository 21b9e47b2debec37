// The program trace viewer (radixlm/trace): a waterfall of a program's gen/select/fork calls, one row per
// program state (run_batch items, fork branches under their parent); a call's click shows its prompt span,
// cached tokens and output. Hand-written, no dependencies: shared by the self-contained HTML files that
// state.save_trace() writes and the server's /dashboard/programs page.
(function () {
  "use strict";
  const NS = "http://www.w3.org/2000/svg";
  function el(tag, attrs, text) {
    const e = tag.startsWith("svg:") ? document.createElementNS(NS, tag.slice(4)) : document.createElement(tag);
    for (const k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function fullTexts(trace) {
    const byId = {}, memo = {};
    trace.states.forEach(s => byId[s.id] = s);
    function full(id) {
      if (memo[id] !== undefined) return memo[id];
      const s = byId[id];
      if (!s) return "";
      const base = s.parent ? full(s.parent).slice(0, s.fork_pos || 0) : "";
      return (memo[id] = base + (s.text || ""));
    }
    trace.states.forEach(s => full(s.id));
    return memo;
  }
  function rowsOf(trace) {  // depth-first: each state followed by its branches
    const kids = {}, roots = [];
    trace.states.forEach(s => (s.parent ? (kids[s.parent] = kids[s.parent] || []).push(s) : roots.push(s)));
    roots.sort((a, b) => (a.item ?? 0) - (b.item ?? 0));  // run_batch items in input order
    const out = [];
    (function walk(list, depth) {
      list.forEach(s => { out.push({state: s, depth}); walk(kids[s.id] || [], depth + 1); });
    })(roots, 0);
    return out;
  }
  function fmt(x) { return x === undefined || x === null ? "–" : x; }
  function render(container, trace) {
    container.innerHTML = "";
    container.classList.add("rt-trace");
    const texts = fullTexts(trace);
    const calls = trace.calls || [];
    const gens = calls.filter(c => c.kind === "gen" || c.kind === "select");
    const prompt = gens.reduce((a, c) => a + (c.prompt_tokens || 0), 0);
    const cached = gens.reduce((a, c) => a + (c.cached_tokens || 0), 0);
    const out = gens.reduce((a, c) => a + (c.completion_tokens || 0), 0);
    container.appendChild(el("h2", {}, trace.name));
    container.appendChild(el("div", {class: "rt-sum", "data-testid": "trace-summary"},
      `${gens.length} gen/select calls · ${trace.states.length} states · ${trace.duration.toFixed(3)} s · ` +
      `prompt ${prompt} tokens, cached ${cached} (${prompt ? (100 * cached / prompt).toFixed(1) : 0}%) · out ${out}`));
    const legend = el("div", {class: "rt-sum"});
    legend.innerHTML = '<svg width="10" height="10"><rect width="10" height="10" class="rt-gen"/></svg> gen ' +
      '<svg width="10" height="10"><rect width="10" height="10" class="rt-select"/></svg> select ' +
      '<svg width="10" height="10"><rect width="10" height="10" class="rt-fork"/></svg> fork ' +
      '<svg width="10" height="10"><rect width="10" height="10" class="rt-commit"/></svg> prefix commit ' +
      '<svg width="10" height="10"><rect width="10" height="10" class="rt-join"/></svg> join · ' +
      '<svg width="10" height="4"><rect width="10" height="4" class="rt-cached"/></svg> cached share of the prompt' +
      (trace.dropped_calls ? ` · ${trace.dropped_calls} more calls not recorded` : "");
    container.appendChild(legend);
    const rows = rowsOf(trace), rowIndex = {};
    rows.forEach((r, i) => rowIndex[r.state.id] = i);
    const W = Math.max(600, (container.clientWidth || 900) - 10), L = 150, H = 18;
    const span = Math.max(trace.duration, 1e-3);
    const x = t => L + (W - L - 10) * t / span;
    const svg = el("svg:svg", {width: W, height: rows.length * H + 24, class: "rt-waterfall"});
    for (let i = 0; i <= 5; i++) {
      const t = span * i / 5;
      svg.appendChild(el("svg:text", {x: x(t), y: 10, class: "rt-axis", "text-anchor": "middle"}, t.toFixed(2) + "s"));
    }
    rows.forEach((r, i) => {
      const s = r.state;
      const label = (s.item !== undefined && s.item !== null ? `item ${s.item}` : (s.parent ? "branch" : "run")) + " " + s.id.slice(0, 6);
      svg.appendChild(el("svg:text", {x: 4 + 10 * r.depth, y: 24 + i * H + 11, class: "rt-row-label"}, label));
    });
    const detail = el("div", {class: "rt-detail"}, "Click a call to see its prompt span, cached tokens and output.");
    calls.forEach((c, k) => {
      const i = rowIndex[c.state];
      if (i === undefined) return;
      const x0 = x(c.start), w = Math.max(2, x(c.end) - x0), y = 24 + i * H + 2;
      const g = el("svg:g", {});
      const rect = el("svg:rect", {x: x0, y, width: w, height: H - 4, class: "rt-call rt-" + c.kind, "data-call": k});
      rect.appendChild(el("svg:title", {}, `${c.kind}${c.name ? " " + c.name : ""}: ${((c.end - c.start) * 1000).toFixed(1)} ms`));
      g.appendChild(rect);
      if (c.prompt_tokens) {  // the cached share of the prompt, as a strip under the bar
        g.appendChild(el("svg:rect", {x: x0, y: y + H - 7, height: 3, width: w * (c.cached_tokens || 0) / c.prompt_tokens, class: "rt-cached"}));
      }
      rect.addEventListener("click", () => showCall(detail, trace, texts, c));
      svg.appendChild(g);
    });
    container.appendChild(svg);
    container.appendChild(detail);
  }
  function showCall(detail, trace, texts, c) {
    detail.innerHTML = "";
    const text = texts[c.state] || "";
    const pct = c.prompt_tokens ? 100 * (c.cached_tokens || 0) / c.prompt_tokens : 0;
    const head = el("div", {});
    head.innerHTML = "";
    head.appendChild(el("b", {}, `${c.kind}${c.name ? " → " + c.name : ""}`));
    head.appendChild(document.createTextNode(
      ` · ${((c.end - c.start) * 1000).toFixed(1)} ms · prompt ${fmt(c.prompt_tokens)} tokens, cached ${fmt(c.cached_tokens)} `));
    const bar = el("span", {class: "rt-bar"}); bar.appendChild(el("span", {style: `width:${pct}%`}));
    head.appendChild(bar);
    head.appendChild(document.createTextNode(`${c.completion_tokens !== undefined && c.completion_tokens !== null ? " · out " + c.completion_tokens + " tokens" : ""}` +
      `${c.finish ? " · " + c.finish : ""}${c.error ? " · error: " + c.error : ""}`));
    detail.appendChild(head);
    if (c.children && c.children.length) detail.appendChild(el("div", {}, `forked into ${c.children.length} branches`));
    const pre = el("pre", {});
    const start = Math.max(0, (c.prompt_end || 0) - 1500);
    pre.appendChild(el("span", {class: "rt-prompt"}, (start ? "…" : "") + text.slice(start, c.prompt_end || 0)));
    pre.appendChild(el("span", {class: "rt-out"}, text.slice(c.prompt_end || 0, c.output_end || c.prompt_end || 0)));
    detail.appendChild(pre);
  }
  window.RadixTrace = {render};
})();
