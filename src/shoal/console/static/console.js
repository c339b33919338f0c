// The shoal console's own script: a job's live log tail and the metric charts (uPlot).
// Every value from the server is set as text (textContent) or handed to uPlot as numbers and
// labels, never as HTML.
"use strict";

(function () {
  const POLL_MS = 1000;

  function followLog(pre) {
    const url = pre.dataset.logUrl;
    const decoder = new TextDecoder();
    let offset = null;
    async function poll() {
      let ended = false;
      try {
        const query = offset === null ? "tail=true" : "offset=" + offset;
        const response = await fetch(url + "?" + query, {credentials: "same-origin"});
        if (response.ok) {
          const bytes = new Uint8Array(await response.arrayBuffer());
          offset = Number(response.headers.get("X-Log-Offset"));
          ended = response.headers.get("X-Job-Ended") === "1";
          if (bytes.length) {
            const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
            pre.append(document.createTextNode(decoder.decode(bytes, {stream: !ended})));
            if (atBottom) pre.scrollTop = pre.scrollHeight;
          }
          pre.dataset.offset = String(offset);
        }
      } catch (e) {
        // a dropped connection (server restart): try again at the same offset
      }
      if (ended) {
        pre.dataset.ended = "1";
      } else {
        setTimeout(poll, POLL_MS);
      }
    }
    poll();
  }

  function askSeries(figure) {
    // data-src: a series URL of this console (/series or a comparison's), to which the
    // figure's pixel width is added so the server thins each series to it.
    const width = Math.max(200, Math.floor(figure.clientWidth || 600));
    const response = fetch(figure.dataset.src + "&width=" + width,
                           {credentials: "same-origin"});
    return {width: width, response: response};
  }

  async function drawChart(figure, asked) {
    const width = asked.width;
    const response = await asked.response;
    if (!response.ok) {
      const note = document.createElement("p");
      note.className = "error";
      note.textContent = "could not load the chart: HTTP " + response.status;
      figure.append(note);
      return;
    }
    const body = await response.json();
    // A comparison comes on one shared x (body.x, each series' y with nulls: uPlot's shape);
    // a run's charts come as series of their own x, joined here (gaps as null).
    const shared = Array.isArray(body.x);
    const byStep = shared ? body.x_is_step : body.series.every((s) => s.x_is_step);
    const first = body.series[0];
    const data = shared ? [body.x, ...body.series.map((s) => s.y)]
               : body.series.length ? uPlot.join(body.series.map((s) => [s.x, s.y]))
               : [[], []];
    const logY = document.getElementById("log-y");
    function render() {
      if (figure.chart) figure.chart.destroy();
      const opts = {
        width: width,
        height: Number(figure.dataset.height || 220),
        scales: {x: {time: !byStep}, y: logY && logY.checked ? {distr: 3} : {}},
        series: [{label: first && first.x_label ? first.x_label : byStep ? "step" : "time"},
                 ...body.series.map((s, i) => ({label: s.name,
                                                stroke: COLOURS[i % COLOURS.length],
                                                width: body.series.length > 4 ? 1 : 1.5,
                                                spanGaps: true}))],
        legend: {show: true},
      };
      if (first && first.x_label) opts.axes = [{label: first.x_label}, {label: first.y_label}];
      figure.chart = new uPlot(opts, data, figure);
      figure.dataset.drawnMs = String(Math.round(performance.now()));  // for bench/console.py
      figure.dataset.drawn = String(body.series.length);
      // the most points any one series sent
      figure.dataset.points = String(Math.max(0, ...body.series.map(
        (s) => s.y.reduce((n, y) => n + (y === null ? 0 : 1), 0))));
    }
    render();
    if (logY) logY.addEventListener("change", render);
  }

  const COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
                   "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];

  // The log's search: the lines holding the text, shown (as text) above the whole log and
  // refreshed as the log grows.
  function searchLog() {
    const input = document.getElementById("log-search");
    const log = document.getElementById("log");
    const matches = document.getElementById("log-matches");
    const count = document.getElementById("log-search-count");
    if (!input || !log || !matches) return;
    function refresh() {
      const needle = input.value;
      if (!needle) {
        matches.hidden = true;
        matches.textContent = "";
        count.textContent = "";
        return;
      }
      const found = log.textContent.split("\n").filter((line) => line.includes(needle));
      matches.textContent = found.join("\n");
      matches.hidden = false;
      count.textContent = found.length + (found.length === 1 ? " line" : " lines");
    }
    input.addEventListener("input", refresh);
    new MutationObserver(refresh).observe(log, {childList: true});
  }

  // This script runs (deferred, before htmx and uPlot) once the document is parsed: the
  // charts' data is asked for now, while the other scripts are still being set up, and each
  // chart is drawn once uPlot is there (DOMContentLoaded) and its data has come.
  const asked = new Map();
  document.querySelectorAll("figure.chart").forEach(function (figure) {
    asked.set(figure, askSeries(figure));
  });
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("pre[data-log-url]").forEach(followLog);
    searchLog();
    document.querySelectorAll("figure.chart").forEach(function (figure) {
      drawChart(figure, asked.get(figure) || askSeries(figure)).catch(function (e) {
        figure.dataset.error = String(e);
      });
    });
  });
})();
