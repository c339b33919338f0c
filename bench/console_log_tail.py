"""How soon a running job's printed line shows in the console's log tail (issue #21: "the log
tail shows a line that a running job printed within 2 s"), in headless Chromium.

    .venv/bin/python bench/console_log_tail.py [--lines 20] [--gap 0.5]

A ``RemoteExecutor`` job on a ``shoal ui`` home (the embedded default: SQLite and local files)
prints a numbered line every ``--gap`` seconds, each with the time it printed it; the job's
page is open in Chromium, which notes (a ``MutationObserver`` on the log, ``Date.now()``)
when each line appears. Prints each line's delay and the median and the largest. The floor
is the console's own poll of the log (once a second: at most ~1 s); a store that is not local
disk adds the log's upload interval (2 s). Chromium: ``SHOAL_TEST_CHROMIUM`` or ``chromium``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _common import cpu_model
from console import start_ui


def _printer(lines: int, gap: float, go: str) -> int:
    import os as _os
    import time as _time

    while not _os.path.exists(go):  # the page is open: start printing
        _time.sleep(0.05)
    for i in range(lines):
        print(f"tail-line {i} at {_time.time():.3f}", flush=True)
        _time.sleep(gap)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=20)
    parser.add_argument("--gap", type=float, default=0.5)
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    chromium = os.environ.get("SHOAL_TEST_CHROMIUM") or shutil.which("chromium")
    if not chromium:
        raise SystemExit("no Chromium: run scripts/chromium.sh or set SHOAL_TEST_CHROMIUM")
    home = Path(tempfile.mkdtemp(prefix="shoal-bench-log-tail-"))
    for name in [k for k in os.environ if k.startswith("SHOAL_")]:
        if name != "SHOAL_TEST_CHROMIUM":
            del os.environ[name]
    os.environ["SHOAL_HOME"] = str(home)
    import shoal
    from shoal import RemoteExecutor

    ui = start_ui(home)
    go = home / "go"
    try:
        with shoal.use(shoal.Session()), RemoteExecutor() as executor, \
                sync_playwright() as p:
            future = executor.submit(_printer, args.lines, args.gap, str(go))
            deadline = time.monotonic() + 120
            while not future.job_name:
                if time.monotonic() > deadline:
                    raise SystemExit("the job was not submitted within 120 s")
                time.sleep(0.05)
            browser = p.chromium.launch(executable_path=chromium, headless=True)
            page = browser.new_page()
            page.goto(f"{ui.url}/jobs/{future.job_name}")
            page.wait_for_selector("#log")
            page.evaluate("""() => { window.seenAt = {};
                new MutationObserver(() => {
                  for (const m of document.querySelector('#log').textContent
                                   .matchAll(/tail-line (\\d+) at/g))
                    if (!(m[1] in window.seenAt)) window.seenAt[m[1]] = Date.now() / 1000;
                }).observe(document.querySelector('#log'),
                           {childList: true, characterData: true, subtree: true}); }""")
            go.touch()
            assert future.result(timeout=300) == args.lines
            page.wait_for_function(f"() => Object.keys(window.seenAt).length >= {args.lines}",
                                   timeout=30_000)
            seen = page.evaluate("window.seenAt")
            log = shoal.Session().jobs.read_log(future.job_name).decode()
            browser.close()
    finally:
        ui.stop()
        shutil.rmtree(home, ignore_errors=True)
    printed = {line.split()[1]: float(line.split()[3]) for line in log.splitlines()
               if line.startswith("tail-line ")}
    delays = [seen[i] - printed[i] for i in printed]
    print(f"{cpu_model()}; load average {os.getloadavg()[0]:.2f}; {len(delays)} lines, one "
          f"every {args.gap} s")
    print("delays (s): " + " ".join(f"{d:.2f}" for d in delays))
    print(f"printed -> shown in the log tail: median {statistics.median(delays):.2f} s, "
          f"largest {max(delays):.2f} s (goal: within 2 s)")


if __name__ == "__main__":
    sys.exit(main())
