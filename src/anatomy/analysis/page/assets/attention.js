/* anatomy attention page: draws the L x H grid and the enlarged map from the embedded weights
   (base64 of little-endian uint16, w * 65535), and shows who attends to whom on hover. */
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("attention-data").textContent);
  var scale = "sqrt";
  var LIGHT = [[247, 251, 255], [198, 219, 239], [107, 174, 214], [33, 113, 181], [8, 48, 107]];
  var DARK = [[21, 27, 38], [29, 58, 102], [47, 111, 222], [143, 184, 255], [240, 246, 255]];

  function decode(g) {
    var text = atob(g.weights);
    var bytes = new Uint8Array(text.length);
    for (var k = 0; k < text.length; k++) bytes[k] = text.charCodeAt(k);
    var view = new DataView(bytes.buffer);
    var n = bytes.length / 2, values = new Float32Array(n);
    for (var m = 0; m < n; m++) values[m] = view.getUint16(2 * m, true) / 65535;
    g.values = values;
    return g;
  }
  var groups = data.groups.map(decode);

  function value(g, li, hi, i, j) {
    var H = g.shape[1], Sq = g.shape[2], Sk = g.shape[3];
    return g.values[((li * H + hi) * Sq + i) * Sk + j];
  }
  function masked(g, i, j) { return g.kind === "causal" && j > i; }
  function dark() { return document.documentElement.getAttribute("data-theme") === "dark"; }
  function shade(w) { return scale === "sqrt" ? Math.sqrt(w) : w; }
  function color(w) {
    var stops = dark() ? DARK : LIGHT, t = Math.min(1, Math.max(0, shade(w))) * (stops.length - 1);
    var k = Math.min(stops.length - 2, Math.floor(t)), f = t - k, a = stops[k], b = stops[k + 1];
    return [Math.round(a[0] + (b[0] - a[0]) * f), Math.round(a[1] + (b[1] - a[1]) * f), Math.round(a[2] + (b[2] - a[2]) * f)];
  }
  function css(rgb, alpha) { return alpha === undefined ? "rgb(" + rgb.join(",") + ")" : "rgba(" + rgb.join(",") + "," + alpha + ")"; }
  var MASKED_LIGHT = [226, 229, 234], MASKED_DARK = [40, 46, 58];
  function shown(token) {
    var t = token.replace(/\n/g, "⏎").replace(/\t/g, "⇥").replace(/\r/g, "");
    return t.trim() === "" ? (t.length ? "␣" : "∅") : t.trim();
  }

  /* the grid: one canvas per layer and head, one pixel per weight, scaled by CSS */
  function drawCell(g, canvas) {
    var li = +canvas.getAttribute("data-li"), hi = +canvas.getAttribute("data-hi");
    var Sq = g.shape[2], Sk = g.shape[3], ctx = canvas.getContext("2d");
    var image = ctx.createImageData(Sk, Sq), px = image.data, maskedColor = dark() ? MASKED_DARK : MASKED_LIGHT;
    for (var i = 0; i < Sq; i++) {
      for (var j = 0; j < Sk; j++) {
        var rgb = masked(g, i, j) ? maskedColor : color(value(g, li, hi, i, j)), o = 4 * (i * Sk + j);
        px[o] = rgb[0]; px[o + 1] = rgb[1]; px[o + 2] = rgb[2]; px[o + 3] = 255;
      }
    }
    ctx.putImageData(image, 0, 0);
  }

  function setup(section) {
    var g = groups[+section.getAttribute("data-group")];
    var L = g.shape[0], H = g.shape[1], Sq = g.shape[2], Sk = g.shape[3];
    var grid = section.querySelector(".attn-grid");
    var cellPx = Math.max(26, Math.min(64, Math.floor(Math.min(480 / H, 1000 / L))));
    grid.style.setProperty("--cell", cellPx + "px");
    var cells = Array.prototype.slice.call(section.querySelectorAll("canvas.cell"));
    cells.forEach(function (c) { c.style.imageRendering = cellPx >= Math.max(Sq, Sk) ? "pixelated" : "auto"; });
    var pickLayer = section.querySelector(".pick-layer"), pickHead = section.querySelector(".pick-head");
    var mapCanvas = section.querySelector("canvas.map"), overlay = section.querySelector("canvas.overlay");
    var rowLabels = section.querySelector(".row-labels"), colLabels = section.querySelector(".col-labels");
    var readout = section.querySelector(".readout");
    var queryStrip = section.querySelector(".token-strip.queries"), keyStrip = section.querySelector(".token-strip.keys");
    var state = { li: 0, hi: 0, c: 12, hover: null };
    var li0 = g.layers.indexOf(+section.getAttribute("data-focus-layer")), hi0 = g.heads.indexOf(+section.getAttribute("data-focus-head"));
    state.li = li0 < 0 ? 0 : li0;
    state.hi = hi0 < 0 ? 0 : hi0;

    function strip(el, tokens, role) {
      if (!el) return [];
      el.textContent = "";
      return tokens.map(function (t, k) {
        var span = document.createElement("span");
        span.className = "tok";
        span.textContent = t.replace(/\n/g, "⏎\n");
        span.setAttribute("data-" + role, k);
        el.appendChild(span);
        return span;
      });
    }
    var qSpans = strip(queryStrip, g.queries, "q");
    var kSpans = keyStrip ? strip(keyStrip, g.keys, "k") : qSpans;
    [[queryStrip, g.queries], [keyStrip, g.keys]].forEach(function (pair) {
      /* WordPiece pieces and bare ids carry no spaces of their own: keep them apart */
      if (pair[0] && !pair[1].some(function (t) { return /^\s/.test(t); })) pair[0].classList.add("spaced");
    });

    function labels() {
      var c = state.c, every = Math.max(1, Math.ceil(13 / c));
      rowLabels.textContent = "";
      colLabels.textContent = "";
      var longest = 1;
      g.queries.concat(g.keys).forEach(function (t) { longest = Math.max(longest, Math.min(18, shown(t).length)); });
      var labelPx = Math.ceil(longest * 7.4 + 10);
      rowLabels.style.width = labelPx + "px";
      colLabels.style.height = Math.ceil(labelPx * 0.82 + 8) + "px";
      g.queries.forEach(function (t, i) {
        if (i % every) return;
        var d = document.createElement("div");
        d.className = "tok-label";
        d.textContent = shown(t).slice(0, 18);
        d.style.top = (i * c + c / 2 - 6) + "px";
        d.setAttribute("data-row", i);
        rowLabels.appendChild(d);
      });
      g.keys.forEach(function (t, j) {
        if (j % every) return;
        var d = document.createElement("div");
        d.className = "tok-label";
        d.textContent = shown(t).slice(0, 18);
        d.style.left = (j * c + c / 2 + 4) + "px";
        d.style.transform = "rotate(-55deg)";
        d.setAttribute("data-col", j);
        colLabels.appendChild(d);
      });
    }

    function drawMap() {
      var frameWidth = Math.max(240, section.querySelector(".enlarged").clientWidth - 140);
      var c = Math.max(5, Math.min(40, Math.floor(Math.min(620, frameWidth) / Math.max(Sq, Sk))));
      state.c = c;
      var ratio = window.devicePixelRatio || 1;
      [mapCanvas, overlay].forEach(function (cv) {
        cv.width = Sk * c * ratio; cv.height = Sq * c * ratio;
        cv.style.width = Sk * c + "px"; cv.style.height = Sq * c + "px";
      });
      var ctx = mapCanvas.getContext("2d");
      ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
      var maskedColor = css(dark() ? MASKED_DARK : MASKED_LIGHT);
      for (var i = 0; i < Sq; i++) {
        for (var j = 0; j < Sk; j++) {
          if (masked(g, i, j)) {
            ctx.fillStyle = maskedColor;
            ctx.fillRect(j * c, i * c, c, c);
            if (c >= 8) {
              ctx.strokeStyle = dark() ? "rgba(255,255,255,.08)" : "rgba(0,0,0,.07)";
              ctx.beginPath(); ctx.moveTo(j * c, i * c + c); ctx.lineTo(j * c + c, i * c); ctx.stroke();
            }
          } else {
            ctx.fillStyle = css(color(value(g, state.li, state.hi, i, j)));
            ctx.fillRect(j * c, i * c, c, c);
          }
        }
      }
      if (c >= 10) {
        ctx.strokeStyle = dark() ? "rgba(0,0,0,.35)" : "rgba(255,255,255,.7)";
        ctx.lineWidth = 1;
        for (var k = 1; k < Math.max(Sq, Sk); k++) {
          if (k < Sk) { ctx.beginPath(); ctx.moveTo(k * c, 0); ctx.lineTo(k * c, Sq * c); ctx.stroke(); }
          if (k < Sq) { ctx.beginPath(); ctx.moveTo(0, k * c); ctx.lineTo(Sk * c, k * c); ctx.stroke(); }
        }
      }
      labels();
      drawOverlay();
      colorbar();
    }

    function drawOverlay() {
      var ctx = overlay.getContext("2d"), c = state.c, ratio = window.devicePixelRatio || 1;
      ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
      ctx.clearRect(0, 0, Sk * c, Sq * c);
      section.querySelectorAll(".tok-label.hot").forEach(function (d) { d.classList.remove("hot"); });
      var h = state.hover;
      if (!h) { tokens(null); return; }
      ctx.fillStyle = dark() ? "rgba(255,255,255,.10)" : "rgba(20,30,60,.08)";
      ctx.fillRect(0, h.i * c, Sk * c, c);
      if (h.j !== null) ctx.fillRect(h.j * c, 0, c, Sq * c);
      ctx.strokeStyle = dark() ? "#ffd166" : "#d9661f";
      ctx.lineWidth = 2;
      ctx.strokeRect(0.5, h.i * c + 0.5, Sk * c - 1, c - 1);
      if (h.j !== null) ctx.strokeRect(h.j * c + 1, h.i * c + 1, c - 2, c - 2);
      var row = rowLabels.querySelector('[data-row="' + h.i + '"]');
      if (row) row.classList.add("hot");
      var col = h.j !== null ? colLabels.querySelector('[data-col="' + h.j + '"]') : null;
      if (col) col.classList.add("hot");
      tokens(h.i);
    }

    function tokens(i) {
      qSpans.concat(keyStrip ? kSpans : []).forEach(function (s) {
        s.style.background = ""; s.style.color = ""; s.classList.remove("src");
      });
      if (i === null) return;
      qSpans[i].classList.add("src");
      kSpans.forEach(function (s, j) {
        if (masked(g, i, j)) return;
        var w = value(g, state.li, state.hi, i, j);
        s.style.background = css(color(Math.max(w, 0)), 0.25 + 0.75 * Math.min(1, shade(w)));
        s.style.color = shade(w) > 0.55 ? (dark() ? "#0f131a" : "#ffffff") : "";
      });
    }

    function describe(i, j) {
      var w = value(g, state.li, state.hi, i, j);
      return "layer " + g.layers[state.li] + ", head " + g.heads[state.hi] + "\n“" + shown(g.queries[i]) + "” (" + i + ") → “" +
        shown(g.keys[j]) + "” (" + j + "): " + (masked(g, i, j) ? "masked" : w.toFixed(4));
    }

    function colorbar() {
      var bar = section.querySelector(".colorbar canvas"), ctx = bar.getContext("2d");
      for (var x = 0; x < bar.width; x++) {
        var t = x / (bar.width - 1), w = scale === "sqrt" ? t * t : t;
        ctx.fillStyle = css(color(w));
        ctx.fillRect(x, 0, 1, bar.height);
      }
      section.querySelector(".scale-name").textContent = scale === "sqrt" ? "colour ∝ √weight (small weights stay visible)" : "colour ∝ weight";
    }

    function focus(li, hi) {
      state.li = li; state.hi = hi; state.hover = null;
      pickLayer.value = String(li); pickHead.value = String(hi);
      cells.forEach(function (c) {
        c.classList.toggle("selected", +c.getAttribute("data-li") === li && +c.getAttribute("data-hi") === hi);
      });
      readout.textContent = "layer " + g.layers[li] + " · head " + g.heads[hi];
      drawMap();
    }

    overlay.addEventListener("mousemove", function (e) {
      var r = overlay.getBoundingClientRect(), c = state.c;
      var i = Math.floor((e.clientY - r.top) / c), j = Math.floor((e.clientX - r.left) / c);
      if (i < 0 || j < 0 || i >= Sq || j >= Sk) return;
      if (!state.hover || state.hover.i !== i || state.hover.j !== j) {
        state.hover = { i: i, j: j };
        drawOverlay();
      }
      var text = describe(i, j);
      readout.textContent = text.replace("\n", ": ");
      if (window.anatomyTip) window.anatomyTip.show(text, e.clientX, e.clientY);
    });
    overlay.addEventListener("mouseleave", function () {
      state.hover = null; drawOverlay();
      readout.textContent = "layer " + g.layers[state.li] + " · head " + g.heads[state.hi];
      if (window.anatomyTip) window.anatomyTip.hide();
    });
    qSpans.forEach(function (s, i) {
      s.addEventListener("mouseenter", function () { state.hover = { i: i, j: null }; drawOverlay(); });
      s.addEventListener("mouseleave", function () { state.hover = null; drawOverlay(); });
    });
    cells.forEach(function (c) {
      function pick() { focus(+c.getAttribute("data-li"), +c.getAttribute("data-hi")); }
      c.addEventListener("click", pick);
      c.addEventListener("keydown", function (e) { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); pick(); } });
      c.setAttribute("data-tip", "layer " + c.getAttribute("data-layer") + ", head " + c.getAttribute("data-head") + ": click to enlarge");
    });
    pickLayer.addEventListener("change", function () { focus(+pickLayer.value, state.hi); });
    pickHead.addEventListener("change", function () { focus(state.li, +pickHead.value); });

    function redraw() { cells.forEach(function (c) { drawCell(g, c); }); drawMap(); }
    redraw();
    focus(state.li, state.hi);
    return { group: g, focus: focus, redraw: redraw, state: state, describe: describe };
  }

  var views = Array.prototype.slice.call(document.querySelectorAll("section.attention-group")).map(setup);
  function redrawAll() { views.forEach(function (v) { v.redraw(); }); }
  document.querySelectorAll('input[name="scale"]').forEach(function (input) {
    input.addEventListener("change", function () { if (input.checked) { scale = input.value; redrawAll(); } });
  });
  document.addEventListener("anatomy-theme", redrawAll);
  var resizeTimer = null;
  window.addEventListener("resize", function () { clearTimeout(resizeTimer); resizeTimer = setTimeout(redrawAll, 150); });
  window.anatomyAttention = {
    groups: groups, views: views,
    value: function (gi, li, hi, i, j) { return value(groups[gi], li, hi, i, j); }
  };
})();
