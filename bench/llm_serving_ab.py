"""Paired A/B of LLM server code (issue #19 item 6): on a shared machine whose load swings
between rounds, two versions are only comparable side by side. Every server named runs at
once (same tiny Llama as bench/llm_serving.py); each round runs the static batched
``generate()`` and bench/llm_serving.py's ``concurrent()`` round against each server, the
order rotating, and then one burst of N streams whose server CPU time per token is measured
(``/proc/PID/stat``, less sensitive to the load than wall time).

    OMP_NUM_THREADS=1 .venv/bin/python bench/llm_serving_ab.py --rounds 16 \\
        old=/tmp/old_src new=src          # NAME=PYTHONPATH of the server's shoal

Printed per server: median tokens/s (and against the static batch), the median of the
per-round ratios to the first server, TTFT p50 of N concurrent and of a lone request, and
the server's and client's CPU seconds per round; with the CPU model and the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics as st
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import llm_serving as bench  # noqa: E402


def serve(directory: Path, port_file: Path, pythonpath: str) -> tuple[subprocess.Popen[bytes], str]:
    import httpx

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": pythonpath}
    proc = subprocess.Popen([sys.executable, "-m", "shoal.serving", "--model", str(directory),
                             "--port", "0", "--port-file", str(port_file), "--log-level",
                             "WARNING"], env=env, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if port_file.exists():
            url = f"http://127.0.0.1:{port_file.read_text().strip()}"
            try:
                if httpx.get(url + "/ping").status_code == 200:
                    return proc, url
            except httpx.TransportError:
                pass
        if proc.poll() is not None:
            raise SystemExit(f"the server of {pythonpath} exited with {proc.returncode}")
        time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"the server of {pythonpath} did not answer /ping within 120 s")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_round(proc: subprocess.Popen[bytes], url: str, prompts: list[str],
              new_tokens: int) -> dict[str, Any]:
    before, client = cpu_seconds(proc.pid), time.process_time()
    result = asyncio.run(bench.concurrent(url, prompts, new_tokens))
    result["server_cpu"] = cpu_seconds(proc.pid) - before
    result["client_cpu"] = time.process_time() - client
    one = bench.RawClient(url).one

    async def burst() -> list[dict[str, float]]:
        return list(await asyncio.gather(*(one(p, new_tokens) for p in prompts)))

    before = cpu_seconds(proc.pid)
    out = asyncio.run(burst())
    result["burst_cpu_us"] = 1e6 * (cpu_seconds(proc.pid) - before) / sum(
        o["tokens"] for o in out)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("servers", nargs="+", help="NAME=PYTHONPATH (the first is the anchor)")
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args()
    specs = [tuple(s.split("=", 1)) for s in args.servers]
    import torch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="llm-ab-", dir=bench.scratch()) as tmp:
        directory = bench.build(Path(tmp) / "model", 128, 2)
        prompts = bench._prompts(args.clients)
        base = bench.Baselines(directory, prompts, args.new_tokens)
        servers = []
        try:
            for i, (_, path) in enumerate(specs):
                servers.append(serve(directory, Path(tmp) / f"port{i}", path))
            results: list[list[dict[str, Any]]] = [[] for _ in specs]
            static: list[float] = []
            loads: list[float] = []
            for r in range(args.rounds):
                loads.append(os.getloadavg()[0])
                order = list(range(len(specs) + 1))
                order = order[r % len(order):] + order[:r % len(order)]
                for i in order:
                    if i == len(specs):
                        static.append(base.static_batch())
                    else:
                        results[i].append(one_round(*servers[i], prompts, args.new_tokens))
        finally:
            for proc, _ in servers:
                proc.terminate()
                proc.wait(30)
    print(f"CPU {bench.cpu_model()}, {os.cpu_count()} CPUs, {args.rounds} rounds, load average "
          f"median {st.median(loads):.1f} ({min(loads):.1f}-{max(loads):.1f}); static batch "
          f"median {st.median(static):.0f} tokens/s")
    for (name, _), rows in zip(specs, results, strict=True):
        bad = [x["tokens"] for x in rows if x["tokens"] != base.total]
        tps = st.median(x["tps"] for x in rows)
        ttft = st.median(x["ttft_p50_s"] for x in rows)
        lone = st.median(x["lone_ttft_s"] for x in rows)
        anchor = st.median(x["tps"] / y["tps"] for x, y in zip(rows, results[0], strict=True))
        print(f"  {name}: {tps:.0f} tokens/s ({100 * tps / st.median(static):.0f}% of the "
              f"static batch), per-round ratio to {specs[0][0]} x{anchor:.2f}; TTFT p50 "
              f"{1000 * ttft:.1f} ms, lone {1000 * lone:.1f} ms, ratio {ttft / lone:.2f}; CPU "
              f"s per round: server {st.median(x['server_cpu'] for x in rows):.3f}, client "
              f"{st.median(x['client_cpu'] for x in rows):.3f}; server CPU per token of a "
              f"burst {st.median(x['burst_cpu_us'] for x in rows):.0f} us"
              f"{'' if not bad else f'  TOKENS MISMATCH {bad} vs {base.total}'}")


if __name__ == "__main__":
    main()
