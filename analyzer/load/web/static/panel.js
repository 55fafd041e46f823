// perfsweep's Server panel: charts, batch-size histogram and the config form, shown above the
// "Server" tab's table in Locust's page; for a generative model's token streams, TTFT, ITL,
// tokens/s and goodput too. Plain DOM (no build step); every value goes in through
// textContent, never innerHTML, because it comes from a server.
(function () {
  "use strict";
  var TAB = "server";
  var POLL_MS = 1000;
  var panel = document.getElementById("perfsweep-panel");
  if (!panel) return;
  var built = false;
  var timer = null;
  var el = {};
  var BATCH_FIELDS = ["max_batch_size", "max_queue_delay_us", "preferred_batch_size", "instance_count"];
  var ENGINE_FIELDS = ["max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill",
                       "gpu_memory_utilization", "instance_count"];

  function activeTab() {
    return new URLSearchParams(window.location.search).get("tab");
  }

  function make(tag, attrs, parent, text) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    if (text !== undefined) node.textContent = text;
    if (parent) parent.appendChild(node);
    return node;
  }

  function fmt(v, digits) {
    if (v === null || v === undefined) return "-";
    return Number(v).toFixed(digits);
  }

  function build() {
    panel.textContent = "";
    var cards = make("div", { "class": "ps-cards" }, panel);
    [["p50", "exact p50 (ms)"], ["p99", "exact p99 (ms)"], ["rps", "throughput (req/s)"],
     ["batch", "avg batch size"], ["queue", "queue / request (us)"],
     ["compute", "compute / request (us)"], ["pending", "pending requests"],
     ["fails", "failed (client / server)"], ["requests", "requests since start"]].forEach(function (c) {
      var card = make("div", { "class": "ps-card" }, cards);
      el[c[0]] = make("div", { "class": "ps-value", "data-ps": c[0] }, card, "-");
      make("div", { "class": "ps-label" }, card, c[1]);
    });
    // Token streams (generative users): shown once a stream has finished.
    el.tokens = make("div", { "class": "ps-tokens", "data-ps": "tokens", hidden: "" }, panel);
    var tcards = make("div", { "class": "ps-cards" }, el.tokens);
    [["ttft50", "TTFT p50 (ms)"], ["ttft99", "TTFT p99 (ms)"], ["itl50", "ITL p50 (ms)"],
     ["itl99", "ITL p99 (ms)"], ["tps", "output tokens/s"], ["goodput", "goodput (req/s)"],
     ["sfails", "failed streams"]].forEach(function (c) {
      var card = make("div", { "class": "ps-card" }, tcards);
      el[c[0]] = make("div", { "class": "ps-value", "data-ps": c[0] }, card, "-");
      make("div", { "class": "ps-label" }, card, c[1]);
    });
    var trow = make("div", { "class": "ps-row" }, el.tokens);
    var tlat = make("div", { "class": "ps-box" }, trow);
    make("h3", {}, tlat, "Time to first token and inter-token latency per second (ms): p99");
    el.tokChart = make("canvas", { width: 560, height: 180, "data-ps": "token-chart" }, tlat);
    var trate = make("div", { "class": "ps-box" }, trow);
    make("h3", {}, trate, "Output tokens/s and streams finished per second");
    el.rateChart = make("canvas", { width: 560, height: 180, "data-ps": "token-rate-chart" }, trate);

    el.batchOnly = [el.batch.parentNode, el.queue.parentNode, el.compute.parentNode];
    var charts = make("div", { "class": "ps-row" }, panel);
    var lat = make("div", { "class": "ps-box" }, charts);
    make("h3", {}, lat, "Exact latency per second (ms): p50, p99");
    el.latChart = make("canvas", { width: 560, height: 180, "data-ps": "latency-chart" }, lat);
    var bat = make("div", { "class": "ps-box" }, charts);
    make("h3", {}, bat, "Average batch size and throughput per second");
    el.batchChart = make("canvas", { width: 560, height: 180, "data-ps": "batch-chart" }, bat);
    el.batchOnly.push(bat);

    var row = make("div", { "class": "ps-row" }, panel);
    var hist = make("div", { "class": "ps-box" }, row);
    make("h3", {}, hist, "Executions by batch size (window)");
    el.hist = make("div", { "class": "ps-hist", "data-ps": "batch-histogram" }, hist);
    var split = make("div", { "class": "ps-box" }, row);
    el.batchOnly.push(hist);
    var splitTitle = make("h3", {}, split, "Per request: queue vs compute (us)");
    el.split = make("div", { "class": "ps-split", "data-ps": "queue-compute" }, split);
    el.batchOnly.push(splitTitle, el.split);
    make("h3", {}, split, "Failures by reason");
    el.failures = make("div", { "class": "ps-failures", "data-ps": "failures" }, split);

    var cfg = make("form", { "class": "ps-box ps-config", "data-ps": "config-form" }, row);
    make("h3", {}, cfg, "Model config (applied with the repository API)");
    [["max_batch_size", "max batch size"], ["max_queue_delay_us", "max queue delay (us)"],
     ["preferred_batch_size", "preferred batch sizes (e.g. 8,4)"],
     ["instance_count", "instances"]].forEach(function (f) {
      var label = make("label", {}, cfg, f[1]);
      el["cfg_" + f[0]] = make("input", { name: f[0], type: "text", "data-ps": "cfg-" + f[0] }, label);
    });
    var apply = make("button", { type: "submit", "data-ps": "apply" }, cfg, "Apply to server");
    el.cfgStatus = make("div", { "class": "ps-status", "data-ps": "config-status" }, cfg);
    cfg.addEventListener("submit", function (ev) {
      ev.preventDefault();
      applyConfig(apply, BATCH_FIELDS, el.cfgStatus, "cfg_", function (c) {
        return "max_batch_size " + c.max_batch_size + ", delay " + c.max_queue_delay_us +
          " us, preferred [" + c.preferred_batch_size.join(",") + "], instances " + c.instance_count;
      });
    });
    el.cfgForm = cfg;

    // A generative model: its engine's knobs instead (vLLM's names), applied the same way.
    var eng = make("form", { "class": "ps-box ps-config", "data-ps": "engine-form", hidden: "" }, row);
    el.engineTitle = make("h3", {}, eng, "Engine settings (applied with the repository API)");
    [["max_num_seqs", "max_num_seqs (running set)"],
     ["max_num_batched_tokens", "max_num_batched_tokens (step budget)"],
     ["enable_chunked_prefill", "chunked prefill (true/false)"],
     ["gpu_memory_utilization", "gpu_memory_utilization (share, blank: engine's own)"],
     ["instance_count", "instances"]].forEach(function (f) {
      var label = make("label", {}, eng, f[1]);
      el["eng_" + f[0]] = make("input", { name: f[0], type: "text", "data-ps": "eng-" + f[0] }, label);
    });
    var engApply = make("button", { type: "submit", "data-ps": "engine-apply" }, eng, "Apply to server");
    el.engStatus = make("div", { "class": "ps-status", "data-ps": "engine-status" }, eng);
    eng.addEventListener("submit", function (ev) {
      ev.preventDefault();
      applyConfig(engApply, ENGINE_FIELDS, el.engStatus, "eng_", function (c) {
        return ENGINE_FIELDS.map(function (f) {
          return f + " " + (c[f] === null || c[f] === undefined ? "-" : c[f]);
        }).join(", ");
      });
    });
    el.engineForm = eng;
    el.meta = make("div", { "class": "ps-meta", "data-ps": "meta" }, panel);
    built = true;
  }

  // One line per series. Same-unit series share a y scale (shared=true); otherwise each is
  // scaled to its own maximum, which its label states.
  function drawLines(canvas, points, series, shared) {
    var ctx = canvas.getContext("2d");
    var w = canvas.width, h = canvas.height, pad = 34;
    ctx.clearRect(0, 0, w, h);
    ctx.font = "11px sans-serif";
    ctx.strokeStyle = "#8888";
    ctx.strokeRect(pad, 6, w - pad - 6, h - pad);
    if (!points.length) return;
    function maxOf(key) {
      var vs = points.map(function (p) { return p[key]; }).filter(function (v) { return v !== null; });
      return Math.max.apply(null, vs.concat([1e-9]));
    }
    var common = Math.max.apply(null, series.map(function (s) { return maxOf(s.key); }));
    ctx.fillStyle = "#888";
    ctx.fillText("last " + points.length + " s", w - 70, h - 10);
    if (shared) ctx.fillText(fmt(common * 1.1, 0), 2, 16);
    series.forEach(function (s, i) {
      var max = shared ? common : maxOf(s.key);
      ctx.strokeStyle = s.color;
      ctx.fillStyle = s.color;
      ctx.beginPath();
      var started = false;
      points.forEach(function (p, j) {
        var v = p[s.key];
        if (v === null) return;
        var x = pad + (w - pad - 6) * (points.length === 1 ? 1 : j / (points.length - 1));
        var y = 6 + (h - pad) * (1 - v / (max * 1.1));
        if (started) ctx.lineTo(x, y); else ctx.moveTo(x, y);
        started = true;
      });
      ctx.stroke();
      ctx.fillText(s.label + " (max " + fmt(maxOf(s.key), 1) + ")", pad + 6 + i * 170, h - 10);
    });
  }

  function render(doc) {
    if (!built) build();
    var c = doc.client.window;
    var s = doc.server || {};
    var sw = s.window || {};
    el.p50.textContent = fmt(c.p50_ms, 2);
    el.p99.textContent = fmt(c.p99_ms, 2);
    el.rps.textContent = fmt(c.throughput_rps, 1);
    el.batch.textContent = fmt(sw.avg_batch_size, 2);
    el.queue.textContent = fmt(sw.queue_us, 0);
    el.compute.textContent = fmt(sw.compute_us, 0);
    el.pending.textContent = s.pending_requests === null || s.pending_requests === undefined ? "-" : String(s.pending_requests);
    el.requests.textContent = String(doc.client.since_start.requests);
    el.fails.textContent = c.errors + " / " + (sw.failure_count === undefined ? "-" : sw.failure_count);

    var pts = doc.history.slice(-120);
    var t = c.tokens;
    el.tokens.hidden = !t;
    if (t) {
      el.ttft50.textContent = fmt(t.ttft_p50_ms, 1);
      el.ttft99.textContent = fmt(t.ttft_p99_ms, 1);
      el.itl50.textContent = fmt(t.itl_p50_ms, 2);
      el.itl99.textContent = fmt(t.itl_p99_ms, 2);
      el.tps.textContent = fmt(t.output_tokens_per_s, 1);
      el.goodput.textContent = t.goodput_rps === null ? "no goal" : fmt(t.goodput_rps, 2);
      el.sfails.textContent = t.failed_streams + " / " + t.streams;
      drawLines(el.tokChart, pts, [{ key: "ttft_p99_ms", label: "TTFT p99", color: "#d7462e" },
                                   { key: "itl_p99_ms", label: "ITL p99", color: "#2e7dd7" }], false);
      drawLines(el.rateChart, pts, [{ key: "tokens_per_s", label: "tokens/s", color: "#2e9d4f" },
                                    { key: "throughput_rps", label: "streams/s", color: "#7b3fc4" }], false);
    }
    drawLines(el.latChart, pts, [{ key: "p50_ms", label: "p50", color: "#2e7dd7" },
                                 { key: "p99_ms", label: "p99", color: "#d7462e" }], true);
    drawLines(el.batchChart, pts, [{ key: "avg_batch_size", label: "batch", color: "#7b3fc4" },
                                   { key: "throughput_rps", label: "req/s", color: "#2e9d4f" }], false);

    el.hist.textContent = "";
    var sizes = sw.batch_sizes || {};
    var top = Math.max.apply(null, Object.values(sizes).concat([1]));
    Object.keys(sizes).forEach(function (k) {
      var line = make("div", { "class": "ps-bar-row", "data-batch-size": k }, el.hist);
      make("span", { "class": "ps-bar-key" }, line, k);
      var bar = make("span", { "class": "ps-bar" }, line);
      bar.style.width = Math.max(1, Math.round(200 * sizes[k] / top)) + "px";
      make("span", { "class": "ps-bar-n" }, line, String(sizes[k]));
    });
    if (!Object.keys(sizes).length) make("div", {}, el.hist, "no executions in the window");

    el.split.textContent = "";
    var q = sw.queue_us || 0, comp = sw.compute_us || 0, total = Math.max(q + comp, 1e-9);
    var stack = make("div", { "class": "ps-stack" }, el.split);
    var qb = make("span", { "class": "ps-queue" }, stack, "queue " + fmt(q, 0));
    var cb = make("span", { "class": "ps-compute" }, stack, "compute " + fmt(comp, 0));
    qb.style.width = (100 * q / total) + "%";
    cb.style.width = (100 * comp / total) + "%";

    el.failures.textContent = "";
    var reasons = sw.failures_by_reason || {};
    Object.keys(reasons).forEach(function (r) { make("div", {}, el.failures, r + ": " + reasons[r]); });
    Object.keys(c.error_kinds || {}).forEach(function (k) {
      make("div", { "class": "ps-error" }, el.failures, "client: " + k + " x" + c.error_kinds[k]);
    });

    var engine = !!(doc.config && doc.config.engine);
    el.cfgForm.hidden = engine;
    el.engineForm.hidden = !engine;
    // A generative engine batches per step inside each stream's one "execution": Triton's
    // batch statistics say nothing of it, so their boxes give way to the token figures.
    el.batchOnly.forEach(function (node) { node.hidden = engine; });
    if (engine) {
      el.engineTitle.textContent = "Engine settings (" + doc.config.engine_name + ", applied with " +
        "the repository API)" + (doc.config.settings_known ? "" : ": defaults shown, the server's own not readable");
      ENGINE_FIELDS.forEach(function (f) {
        var input = el["eng_" + f];
        var v = doc.config[f];
        if (document.activeElement !== input && !input.dataset.dirty) input.value = v === null || v === undefined ? "" : String(v);
      });
    } else if (doc.config) {
      ["max_batch_size", "max_queue_delay_us", "instance_count"].forEach(function (f) {
        var input = el["cfg_" + f];
        if (document.activeElement !== input && !input.dataset.dirty) input.value = String(doc.config[f]);
      });
      var pref = el.cfg_preferred_batch_size;
      if (document.activeElement !== pref && !pref.dataset.dirty) pref.value = doc.config.preferred_batch_size.join(",");
    }
    el.meta.textContent = "model " + doc.model + " at " + doc.target + " | " + doc.state +
      ", " + doc.users + " users | window " + doc.client.window_s + " s | config reloads seen: " +
      doc.server_reloads + (Object.keys(doc.errors).length ? " | " + JSON.stringify(doc.errors) : "");
  }

  function applyConfig(button, fields, status, prefix, describe) {
    var body = {};
    fields.forEach(function (f) { body[f] = el[prefix + f].value; });
    button.disabled = true;
    status.textContent = "applying...";
    fetch("./perfsweep/config", {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
    }).then(function (r) { return r.json(); }).then(function (res) {
      if (res.ok) {
        status.textContent = "applied: " + describe(res.config);
        fields.forEach(function (f) { delete el[prefix + f].dataset.dirty; });
      } else {
        status.textContent = "refused: " + res.error;
      }
    }).catch(function (e) { status.textContent = "failed: " + e; })
      .finally(function () { button.disabled = false; });
  }

  function poll() {
    fetch("./perfsweep/server").then(function (r) { return r.json(); }).then(render)
      .catch(function () { /* the next poll retries */ });
  }

  function anchor() {
    // The native table of the Server tab (Locust renders it); the panel goes right above it.
    var heads = document.querySelectorAll("th");
    for (var i = 0; i < heads.length; i++) {
      if (heads[i].textContent === "Server metric") {
        var container = heads[i].closest(".MuiTableContainer-root") || heads[i].closest("table");
        return container;
      }
    }
    return null;
  }

  function sync() {
    var show = activeTab() === TAB;
    if (show) {
      var a = anchor();
      if (a && panel.nextSibling !== a) a.parentNode.insertBefore(panel, a);
      else if (!a && !panel.isConnected) document.body.appendChild(panel);
      panel.hidden = false;
      if (!timer) { poll(); timer = setInterval(poll, POLL_MS); }
    } else {
      panel.hidden = true;
      if (timer) { clearInterval(timer); timer = null; }
    }
  }

  document.addEventListener("input", function (ev) {
    if (ev.target && ev.target.closest && ev.target.closest("#perfsweep-panel")) ev.target.dataset.dirty = "1";
  });
  setInterval(sync, 300);
  sync();
})();
