/* Before first paint: the saved theme, else the system's. Storage may be refused (a sandboxed frame). */
(function () {
  var saved = null;
  try { saved = window.localStorage.getItem("anatomy-theme"); } catch (e) { saved = null; }
  var dark = window.matchMedia && window.matchMedia("(prefers-color-scheme: dark)").matches;
  document.documentElement.setAttribute("data-theme", saved || (dark ? "dark" : "light"));
})();
