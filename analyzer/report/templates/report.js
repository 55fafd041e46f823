"use strict";
(function () {
  // Sortable tables: click a header; numbers sort numerically, "-" last.
  function cellValue(row, index) {
    var cell = row.cells[index];
    var raw = cell ? (cell.getAttribute("data-v") || cell.textContent.trim()) : "";
    var n = parseFloat(raw);
    return { raw: raw, num: isNaN(n) || !/^-?[0-9.]/.test(raw) ? null : n };
  }
  document.querySelectorAll("table.sortable").forEach(function (table) {
    var headers = table.tHead ? table.tHead.rows[0].cells : [];
    Array.prototype.forEach.call(headers, function (th, index) {
      th.addEventListener("click", function () {
        var ascending = th.getAttribute("aria-sort") !== "ascending";
        Array.prototype.forEach.call(headers, function (h) { h.removeAttribute("aria-sort"); });
        th.setAttribute("aria-sort", ascending ? "ascending" : "descending");
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        rows.sort(function (a, b) {
          var x = cellValue(a, index), y = cellValue(b, index);
          if (x.num === null && y.num === null) {
            return ascending ? x.raw.localeCompare(y.raw) : y.raw.localeCompare(x.raw);
          }
          if (x.num === null) { return 1; }
          if (y.num === null) { return -1; }
          return ascending ? x.num - y.num : y.num - x.num;
        });
        rows.forEach(function (r) { body.appendChild(r); });
      });
    });
  });

  // Copy buttons: the Clipboard API where allowed, else a hidden textarea + execCommand
  // (file:// pages and older browsers).
  function fallbackCopy(text) {
    var area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.style.position = "fixed";
    area.style.opacity = "0";
    document.body.appendChild(area);
    area.select();
    var ok = false;
    try { ok = document.execCommand("copy"); } catch (e) { ok = false; }
    document.body.removeChild(area);
    return ok;
  }
  document.querySelectorAll("button.copy").forEach(function (button) {
    button.addEventListener("click", function () {
      var source = document.getElementById(button.getAttribute("data-target"));
      var text = source ? source.textContent : "";
      function done(ok) {
        button.textContent = ok ? "copied" : "copy failed";
        button.setAttribute("data-copied", ok ? "yes" : "no");
        setTimeout(function () { button.textContent = "copy"; }, 2000);
      }
      if (navigator.clipboard && window.isSecureContext) {
        navigator.clipboard.writeText(text).then(function () { done(true); },
          function () { done(fallbackCopy(text)); });
      } else {
        done(fallbackCopy(text));
      }
    });
  });
})();
