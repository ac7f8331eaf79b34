// popmq console: progressive enhancement only (every page works without it).
// - [data-refresh=N]: reload that part of the page every N seconds while the tab is visible;
// - form[data-confirm]: ask before a change that moves offsets or resends messages;
// - [data-time]: show epoch milliseconds as local time.
"use strict";

function showTimes(root) {
  root.querySelectorAll("[data-time]").forEach((el) => {
    const ms = Number(el.dataset.time);
    if (ms > 0) el.textContent = new Date(ms).toLocaleString();
  });
}

function refreshEvery(el) {
  const seconds = Math.max(Number(el.dataset.refresh) || 5, 2);
  setInterval(async () => {
    if (document.hidden) return;
    try {
      const response = await fetch(location.href, { credentials: "same-origin" });
      if (!response.ok || response.redirected) return;
      const page = new DOMParser().parseFromString(await response.text(), "text/html");
      const fresh = page.querySelector("[data-refresh]");
      if (fresh) { el.innerHTML = fresh.innerHTML; showTimes(el); }
    } catch (_) { /* the console is restarting: try again next time */ }
  }, seconds * 1000);
}

document.addEventListener("DOMContentLoaded", () => {
  showTimes(document);
  document.querySelectorAll("[data-refresh]").forEach(refreshEvery);
  document.querySelectorAll("form[data-confirm]").forEach((form) => {
    form.addEventListener("submit", (event) => {
      if (!window.confirm(form.dataset.confirm)) event.preventDefault();
    });
  });
});
