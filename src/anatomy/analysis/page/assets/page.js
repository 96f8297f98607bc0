/* anatomy page: theme switch, tooltips, diagram selection, trace filter. No dependencies. */
(function () {
  "use strict";
  var root = document.documentElement;

  /* theme */
  var toggle = document.getElementById("theme-toggle");
  if (toggle) {
    toggle.addEventListener("click", function () {
      var next = root.getAttribute("data-theme") === "dark" ? "light" : "dark";
      root.setAttribute("data-theme", next);
      try { window.localStorage.setItem("anatomy-theme", next); } catch (e) { /* not allowed here */ }
      document.dispatchEvent(new CustomEvent("anatomy-theme", { detail: next }));
    });
  }

  /* tooltips: any element with data-tip */
  var tip = document.getElementById("tip");
  function place(x, y) {
    var w = tip.offsetWidth, h = tip.offsetHeight;
    var left = x + 14, top = y + 16;
    if (left + w > window.innerWidth - 8) left = Math.max(8, x - w - 14);
    if (top + h > window.innerHeight - 8) top = Math.max(8, y - h - 12);
    tip.style.left = left + "px";
    tip.style.top = top + "px";
  }
  function show(text, x, y) {
    if (!tip || !text) return;
    tip.textContent = text;
    tip.classList.add("on");
    place(x, y);
  }
  function hide() { if (tip) tip.classList.remove("on"); }
  window.anatomyTip = { show: show, hide: hide };
  document.addEventListener("mouseover", function (e) {
    var el = e.target.closest && e.target.closest("[data-tip]");
    if (el) show(el.getAttribute("data-tip"), e.clientX, e.clientY);
  });
  document.addEventListener("mousemove", function (e) {
    if (tip && tip.classList.contains("on")) place(e.clientX, e.clientY);
  });
  document.addEventListener("mouseout", function (e) {
    var el = e.target.closest && e.target.closest("[data-tip]");
    if (el && !(e.relatedTarget && el.contains(e.relatedTarget))) hide();
  });
  document.addEventListener("focusin", function (e) {
    var el = e.target.closest && e.target.closest("[data-tip]");
    if (el) {
      var r = el.getBoundingClientRect();
      show(el.getAttribute("data-tip"), r.right, r.top);
    }
  });
  document.addEventListener("focusout", hide);

  /* the diagram's parts: one detail panel at a time */
  function select(id, scroll) {
    var details = document.querySelectorAll(".detail");
    if (!details.length) return;
    var found = false;
    details.forEach(function (d) {
      var on = d.getAttribute("data-for") === id;
      d.hidden = !on;
      found = found || on;
    });
    var placeholder = document.getElementById("details-placeholder");
    if (placeholder) placeholder.hidden = found;
    document.querySelectorAll(".component").forEach(function (c) {
      c.classList.toggle("selected", c.getAttribute("data-part") === id);
    });
    document.querySelectorAll("#ledger tr[data-part]").forEach(function (r) {
      r.classList.toggle("selected", r.getAttribute("data-part") === id);
    });
    if (scroll && found) {
      var panel = document.getElementById("details");
      if (panel) panel.scrollIntoView({ behavior: "smooth", block: "nearest" });
    }
  }
  window.anatomySelect = select;
  document.addEventListener("click", function (e) {
    var c = e.target.closest && e.target.closest(".component, .cell-group[data-part], #ledger tr[data-part]");
    if (!c || !c.getAttribute("data-part")) return;
    select(c.getAttribute("data-part"), !c.classList.contains("component"));
  });
  document.addEventListener("keydown", function (e) {
    if ((e.key === "Enter" || e.key === " ") && e.target.classList && e.target.classList.contains("component")) {
      e.preventDefault();
      select(e.target.getAttribute("data-part"), false);
    }
  });

  /* the shape trace: filter rows by every word typed, open the groups that match */
  var filter = document.getElementById("trace-filter");
  var count = document.getElementById("trace-count");
  var groups = Array.prototype.slice.call(document.querySelectorAll("details.group"));
  var rows = Array.prototype.slice.call(document.querySelectorAll("table.trace tbody tr"));
  var initiallyOpen = groups.map(function (g) { return g.open; });
  function applyFilter() {
    var words = (filter.value || "").toLowerCase().split(/\s+/).filter(Boolean);
    var shown = 0;
    rows.forEach(function (r) {
      var text = r.getAttribute("data-search") || "";
      var ok = words.every(function (w) { return text.indexOf(w) >= 0; });
      r.classList.toggle("hidden", !ok);
      if (ok) shown += 1;
    });
    groups.forEach(function (g, i) {
      var any = g.querySelector("tbody tr:not(.hidden)") !== null;
      g.classList.toggle("hidden", !any);
      g.open = words.length ? any : initiallyOpen[i];
    });
    document.querySelectorAll(".phase").forEach(function (p) {
      p.classList.toggle("hidden", p.querySelector("details.group:not(.hidden)") === null);
    });
    if (count) count.textContent = words.length ? shown + " of " + rows.length + " ops match" : rows.length + " ops";
  }
  if (filter) {
    filter.addEventListener("input", applyFilter);
    applyFilter();
  }
  function openAll(open) { groups.forEach(function (g) { if (!g.classList.contains("hidden")) g.open = open; }); }
  var openButton = document.getElementById("trace-open"), closeButton = document.getElementById("trace-close");
  if (openButton) openButton.addEventListener("click", function () { openAll(true); });
  if (closeButton) closeButton.addEventListener("click", function () { openAll(false); });
})();
