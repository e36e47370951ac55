// Runs page: replace the table body with the server's rendering every
// second (the server escapes every value; nothing here builds HTML).
"use strict";
(function () {
  const table = document.getElementById("runs");
  if (!table) return;
  const url = table.dataset.rows;
  const updated = document.getElementById("updated");
  let busy = false;
  async function refresh() {
    if (busy || document.hidden) return;
    busy = true;
    const asked = Date.now();
    try {
      const resp = await fetch(url, { credentials: "same-origin", cache: "no-store" });
      if (!resp.ok) throw new Error("runs: HTTP " + resp.status);
      const html = await resp.text();
      const tpl = document.createElement("template");
      tpl.innerHTML = html;
      const body = tpl.content.querySelector("tbody");
      const old = document.getElementById("runs-body");
      if (body && old) {
        // Keep the runs ticked for Compare across refreshes.
        const picked = new Set([...old.querySelectorAll('input[name="run"]:checked')].map((c) => c.value));
        for (const c of body.querySelectorAll('input[name="run"]')) c.checked = picked.has(c.value);
        old.replaceWith(body);
      }
      table.classList.remove("stale");
      // When the data shown was asked for: what is on the page is at
      // least as new as this.
      table.dataset.updatedMs = String(asked);
      if (updated) updated.textContent = "live: updated " + new Date(asked).toISOString().slice(11, 19) + " UTC, every second";
    } catch (e) {
      // A collector restart or a network blip: show it, keep polling.
      table.classList.add("stale");
    } finally {
      busy = false;
    }
  }
  setInterval(refresh, Number(table.dataset.pollMs) || 1000);
})();
