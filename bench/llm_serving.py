"""LLM serving (issue #8): continuous batching vs ``generate()`` one request after another and
vs one static batched ``generate()`` (the ceiling), on a tiny random-init Llama on CPU.

    OMP_NUM_THREADS=1 .venv/bin/python bench/llm_serving.py [--clients 16] [--new-tokens 64]
        [--hidden 128] [--layers 2] [--rounds 3] [--client raw|httpx]

The default model is a tiny Llama (hidden 128, 2 layers, 4 heads, vocabulary 1000; --hidden
and --layers change it; see docs/performance.md for other sizes). The server is
``python -m shoal.serving --model DIR`` in its own process (one torch thread, as here); the
clients stream ``/generate_stream`` (SSE) from this process, each on its own connection, so the
time to each request's first token is measured where a client sees it. The default client is a
lean one on asyncio streams that still does a real client's work (HTTP/1.1, chunked decoding,
SSE framing, JSON of every event); ``--client httpx`` uses httpx.

Reported: total tokens/s of N concurrent requests of M new tokens, against the same N prompts
served one after another with ``generate()`` and all at once with one left-padded batched
``generate()``, best and median of the rounds; TTFT p50/p99; and a request sent while a batch
of N decodes: its TTFT and whether its first token arrived before the batch finished.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

WORDS = ("shoal reef tide server token batch stream request answer model layer cache queue "
         "prompt slot step").split()


def _texts() -> list[str]:
    import random

    rng = random.Random(0)
    return [" ".join(rng.choice(WORDS) for _ in range(12)) + "." for _ in range(400)]


def _prompts(n: int) -> list[str]:
    import random

    rng = random.Random(1)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 20))) for _ in range(n)]


def build(directory: Path, hidden: int = 256, layers: int = 4) -> Path:
    from shoal.llm import create_tiny_model, write_serving_properties

    create_tiny_model(directory, _texts(), vocab_size=1000, hidden_size=hidden,
                      num_layers=layers, num_heads=max(2, hidden // 32), max_positions=512,
                      initializer_range=0.02)
    write_serving_properties(directory, {"engine": "Python", "option.dtype": "fp32",
                                         "option.max_rolling_batch_size": 32})
    return directory


class Baselines:
    """transformers' ``generate()`` on the same weights and prompts, in this process."""

    def __init__(self, directory: Path, prompts: list[str], new_tokens: int) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(directory)
        self.model = AutoModelForCausalLM.from_pretrained(directory).eval()
        self.model.generation_config.max_length = None
        self.prompts = prompts
        self.total = len(prompts) * new_tokens
        self.kw = {"max_new_tokens": new_tokens, "min_new_tokens": new_tokens,
                   "do_sample": False, "pad_token_id": self.tok.pad_token_id}
        self._run([prompts[0]])  # warm-up

    def _run(self, prompts: list[str]) -> float:
        import torch

        self.tok.padding_side = "left"
        batch = self.tok(prompts, return_tensors="pt", padding=True)
        started = time.perf_counter()
        with torch.no_grad():
            self.model.generate(**batch, **self.kw)
        return time.perf_counter() - started

    def sequential(self) -> float:
        """tokens/s serving the prompts one after another."""
        return self.total / sum(self._run([p]) for p in self.prompts)

    def static_batch(self) -> float:
        """tokens/s of one left-padded batched generate() of all the prompts (the ceiling)."""
        return self.total / self._run(self.prompts)


async def _one_httpx(client, prompt: str, new_tokens: int) -> dict[str, float]:
    sent = time.perf_counter()
    first = None
    tokens = 0
    body = {"inputs": prompt, "parameters": {"max_new_tokens": new_tokens}}
    async with client.stream("POST", "/generate_stream", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                json.loads(line[6:])
                tokens += 1
                if first is None:
                    first = time.perf_counter()
    done = time.perf_counter()
    return {"sent": sent, "first": first or done, "done": done, "tokens": tokens}


class RawClient:
    """A lean streaming client on asyncio streams, doing what any SSE client does: one
    HTTP/1.1 connection per request, the POST, the status and headers, the chunked body
    decoded, split into events and every event's JSON parsed. (httpx spends 2-6x the CPU per
    event, and this process shares the machine's cores with the server.)"""

    def __init__(self, url: str) -> None:
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80

    async def one(self, prompt: str, new_tokens: int) -> dict[str, float]:
        sent = time.perf_counter()
        first = None
        tokens = 0
        body = json.dumps({"inputs": prompt,
                           "parameters": {"max_new_tokens": new_tokens}}).encode()
        reader, writer = await asyncio.open_connection(self.host, self.port)
        try:
            writer.write(b"POST /generate_stream HTTP/1.1\r\nHost: %s:%d\r\n"
                         b"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
                         b"Content-Length: %d\r\nConnection: close\r\n\r\n%s"
                         % (self.host.encode(), self.port, len(body), body))
            status = await reader.readline()
            headers = {}
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode("latin-1").partition(":")
                headers[name.strip().lower()] = value.strip().lower()
            if not status.startswith(b"HTTP/1.1 200") \
                    or headers.get("transfer-encoding") != "chunked":
                raise RuntimeError(f"unexpected answer: {status!r} {headers}")
            pending = b""
            while size := int((await reader.readline()).split(b";")[0], 16):
                pending += (await reader.readexactly(size + 2))[:-2]
                *events, pending = pending.split(b"\n\n")
                for event in events:
                    for line in event.split(b"\n"):
                        if line.startswith(b"data:"):
                            json.loads(line[5:])
                            tokens += 1
                            if first is None:
                                first = time.perf_counter()
            await reader.readline()  # the empty trailer
        finally:
            writer.close()
        done = time.perf_counter()
        return {"sent": sent, "first": first or done, "done": done, "tokens": tokens}


async def concurrent(url: str, prompts: list[str], new_tokens: int, client_kind: str = "raw"
                     ) -> dict[str, object]:
    import httpx

    limits = httpx.Limits(max_connections=len(prompts) + 4)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        if client_kind == "httpx":
            def one(prompt: str, n: int) -> Any:
                return _one_httpx(client, prompt, n)
        else:
            one = RawClient(url).one
        await one(prompts[0], 4)  # warm-up
        started = time.perf_counter()
        results = await asyncio.gather(*(one(p, new_tokens) for p in prompts))
        wall = time.perf_counter() - started
        ttft = sorted(r["first"] - r["sent"] for r in results)
        # a request arriving while the batch decodes
        batch = [asyncio.create_task(one(p, new_tokens)) for p in prompts]
        await asyncio.sleep(0.25 * wall)
        late = await one("a late request joins the batch", 16)
        rest = await asyncio.gather(*batch)
    total = sum(r["tokens"] for r in results)
    batch_end = max(r["done"] for r in rest)
    return {"tps": total / wall, "wall_s": wall, "tokens": total,
            "ttft_p50_s": statistics.median(ttft),
            "ttft_p99_s": ttft[min(len(ttft) - 1, round(0.99 * (len(ttft) - 1)))],
            "late_ttft_s": late["first"] - late["sent"],
            "late_first_token_before_batch_end": late["first"] < batch_end,
            "late_first_token_to_batch_end_s": batch_end - late["first"]}


def serve(directory: Path) -> tuple[subprocess.Popen[bytes], str]:
    port_file = directory.parent / "port"
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    proc = subprocess.Popen([sys.executable, "-m", "shoal.serving", "--model", str(directory),
                             "--port", "0", "--port-file", str(port_file),
                             "--log-level", "WARNING"], env=env)
    import httpx

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
            raise SystemExit(f"the server exited with status {proc.returncode}")
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("the server did not answer /ping within 120 s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=128, help="model width (64: shoal.llm's "
                        "tiny default)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--client", choices=("raw", "httpx"), default="raw",
                        help="the streaming client: lean asyncio streams (default) or httpx")
    parser.add_argument("--rounds", type=int, default=3,
                        help="alternate the static batch and the server this many times and "
                             "keep the best of each (the machine is shared and noisy)")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    with tempfile.TemporaryDirectory(prefix="shoal-bench-llm-") as tmp:
        directory = build(Path(tmp) / "model", args.hidden, args.layers)
        prompts = _prompts(args.clients)
        base = Baselines(directory, prompts, args.new_tokens)
        sequential = base.sequential()
        proc, url = serve(directory)
        static: list[float] = []
        runs: list[dict[str, object]] = []
        try:
            for _ in range(args.rounds):
                static.append(base.static_batch())
                runs.append(asyncio.run(concurrent(url, prompts, args.new_tokens,
                                                   args.client)))
        finally:
            proc.terminate()
            proc.wait(30)
    ceiling = max(static)
    served = max(runs, key=lambda r: float(r["tps"]))  # type: ignore[arg-type]
    tps = float(served["tps"])  # type: ignore[arg-type]
    tps_median = statistics.median(float(r["tps"]) for r in runs)  # type: ignore[arg-type]
    static_median = statistics.median(static)
    print(f"{args.clients} requests x {args.new_tokens} new tokens, tiny Llama hidden "
          f"{args.hidden}, {args.layers} layers, torch threads {torch.get_num_threads()}, "
          f"{args.client} client, {args.rounds} alternating rounds (best; median)")
    print(f"  generate() one after another : {sequential:8.1f} tokens/s")
    print(f"  one static batched generate(): {ceiling:8.1f} tokens/s; median "
          f"{static_median:.0f} (ceiling; rounds: {', '.join(f'{x:.0f}' for x in static)})")
    rounds = ", ".join(f"{float(r['tps']):.0f}" for r in runs)  # type: ignore[arg-type]
    print(f"  shoal LLM server, concurrent : {tps:8.1f} tokens/s; median {tps_median:.0f} "
          f"(rounds: {rounds}; {served['tokens']} tokens)")
    print(f"    vs sequential: {tps / sequential:.2f}x; median {tps_median / sequential:.2f}x "
          f"(target >= 5x)")
    print(f"    vs static batch: {100 * tps / ceiling:.0f}% (best/best); median "
          f"{100 * tps_median / static_median:.0f}% (median/median) (target >= 80%)")
    print(f"    TTFT p50 {1000 * float(served['ttft_p50_s']):.0f} ms, "  # type: ignore[arg-type]
          f"p99 {1000 * float(served['ttft_p99_s']):.0f} ms")  # type: ignore[arg-type]
    print(f"  a request sent while {args.clients} decode: TTFT "
          f"{1000 * float(served['late_ttft_s']):.0f} ms; "  # type: ignore[arg-type]
          f"first token before the batch finished: "
          f"{served['late_first_token_before_batch_end']} "
          f"({float(served['late_first_token_to_batch_end_s']):.2f} s before its end)")  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
