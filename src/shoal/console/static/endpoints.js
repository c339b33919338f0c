// An endpoint's load over time: asks the console for the endpoint's scraped rate and
// latency every 2 s (the console keeps the scrapes) and draws them with uPlot. Values are
// set as text or handed to uPlot as numbers, never as HTML.
"use strict";

(function () {
  const POLL_MS = 2000;

  function chart(figure, label, colour, data) {
    const width = Math.max(300, Math.floor(figure.clientWidth || 520));
    return new uPlot({
      width: width, height: 200,
      scales: {x: {time: true}},
      series: [{label: "time"}, {label: label, stroke: colour, width: 1.5, spanGaps: true,
                                 points: {show: true, size: 4}}],
      legend: {show: true},
    }, data, figure);
  }

  function follow(box) {
    const rateFigure = document.getElementById("rate-chart");
    const latencyFigure = document.getElementById("latency-chart");
    const now = document.getElementById("load-now");
    let charts = null;
    function draw(body) {
      const rate = [body.t, body.rate];
      const latency = [body.t, body.latency_ms];
      if (charts === null) {
        charts = [chart(rateFigure, "requests/s", "#1f77b4", rate),
                  chart(latencyFigure, "ms", "#d62728", latency)];
      } else {
        charts[0].setData(rate);
        charts[1].setData(latency);
      }
      const n = body.t.length;
      box.dataset.points = String(n);
      box.dataset.lastRate = n ? String(body.rate[n - 1]) : "";
      const parts = body.instances.map((i) => i.error ? i.url + ": " + i.error
        : i.url + ": " + i.requests + " requests" + (i.latency ? " · " + i.latency : "")
          + " · " + i.queue + " queued");
      if (n) parts.unshift("now " + body.rate[n - 1].toFixed(2) + " requests/s");
      now.textContent = parts.length ? parts.join(" — ") : "no instance in service";
    }
    async function poll() {
      try {
        const response = await fetch(box.dataset.loadUrl, {credentials: "same-origin"});
        if (response.ok) draw(await response.json());
      } catch (e) {
        // a dropped connection: the next poll tries again
      }
      setTimeout(poll, POLL_MS);
    }
    poll();
  }

  document.addEventListener("DOMContentLoaded", function () {
    const box = document.getElementById("load");
    if (box) follow(box);
  });
})();
