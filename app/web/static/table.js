// nightdesk: sort tables by a header click, and open or close every node of a sample at once.
// Plain JavaScript, served by the app itself: no build step, nothing from a CDN.
"use strict";

function sortTable(table, th) {
  const index = Array.from(th.parentNode.children).indexOf(th);
  const numeric = th.dataset.sort === "number";
  const ascending = th.getAttribute("aria-sort") !== "ascending";
  const body = table.tBodies[0];
  const key = (row) => {
    const cell = row.children[index];
    const raw = cell.dataset.value !== undefined ? cell.dataset.value : cell.textContent.trim();
    if (!numeric) return raw.toLowerCase();
    const n = parseFloat(raw);
    return Number.isNaN(n) ? -Infinity : n;
  };
  const rows = Array.from(body.rows);
  rows.sort((a, b) => {
    const ka = key(a), kb = key(b);
    const order = ka < kb ? -1 : ka > kb ? 1 : 0;
    return ascending ? order : -order;
  });
  rows.forEach((row) => body.appendChild(row));
  table.querySelectorAll("thead th").forEach((h) => h.removeAttribute("aria-sort"));
  th.setAttribute("aria-sort", ascending ? "ascending" : "descending");
}

document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("table.sortable").forEach((table) => {
    table.querySelectorAll("thead th[data-sort]").forEach((th) => {
      th.addEventListener("click", () => sortTable(table, th));
    });
  });
  document.querySelectorAll("[data-toggle-all]").forEach((button) => {
    button.addEventListener("click", () => {
      const all = button.closest("section").querySelectorAll("details");
      const open = !Array.from(all).every((d) => d.open);
      all.forEach((d) => { d.open = open; });
      button.textContent = open ? "collapse all" : "expand all";
    });
  });
});
