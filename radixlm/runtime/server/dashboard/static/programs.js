// /dashboard/programs: the program traces this key posted (the admin key: everyone's), one shown at a time.
(function () {
  "use strict";
  const $ = id => document.getElementById(id);
  const m = location.hash.match(/key=([^&]+)/);
  if (m) { sessionStorage.setItem("radixlm-key", decodeURIComponent(m[1])); history.replaceState(null, "", location.pathname); }
  const headers = () => { const k = sessionStorage.getItem("radixlm-key"); return k ? {Authorization: "Bearer " + k} : {}; };
  $("keyform").addEventListener("submit", ev => { ev.preventDefault(); sessionStorage.setItem("radixlm-key", $("key").value); $("keyform").hidden = true; load(); });
  async function get(path) {
    const res = await fetch(path, {headers: headers(), cache: "no-store"});
    if (res.status === 401 || res.status === 403) {
      const body = await res.json().catch(() => ({}));
      $("keymsg").textContent = (body.error && body.error.message) || "an API key is needed";
      $("keyform").hidden = false;
      throw new Error("key");
    }
    if (!res.ok) throw new Error("HTTP " + res.status);
    return res.json();
  }
  async function show(id) {
    const trace = await get("/dashboard/programs/traces/" + encodeURIComponent(id));
    RadixTrace.render($("trace"), trace);
  }
  async function load() {
    try {
      const {traces} = await get("/dashboard/programs/traces");
      $("status").textContent = traces.length + " traces"; $("status").className = "status live";
      const rows = traces.map(t => `<tr data-id="${t.id}" data-testid="trace-row" style="cursor:pointer"><th>${t.name.replace(/</g, "&lt;")}</th>` +
        `<td>${new Date(t.started_at * 1000).toLocaleTimeString()}</td><td>${t.num_calls} calls</td>` +
        `<td>${t.prompt_tokens ? (100 * t.cached_tokens / t.prompt_tokens).toFixed(0) : 0}% cached</td><td>${t.duration.toFixed(2)} s</td></tr>`);
      $("list").innerHTML = `<tr><th>program</th><th>started</th><th></th><th></th><th></th></tr>` + rows.join("");
      $("list").querySelectorAll("tr[data-id]").forEach(tr => tr.addEventListener("click", () => show(tr.dataset.id)));
      const want = location.hash.slice(1) || (traces[0] && traces[0].id);
      if (want) await show(want);
    } catch (e) {
      if (e.message !== "key") { $("status").textContent = "error: " + e.message; $("status").className = "status error"; }
    }
  }
  load();
})();
