"""LLM serving (issue #8): continuous batching vs ``generate()`` one request after another and
vs one static batched ``generate()`` (the ceiling), on a tiny random-init Llama on CPU.

    OMP_NUM_THREADS=1 .venv/bin/python bench/llm_serving.py [--clients 16] [--new-tokens 64]
        [--hidden 128] [--layers 2] [--rounds 5] [--client raw|httpx]

The default model is a tiny Llama (hidden 128, 2 layers, 4 heads, vocabulary 1000; --hidden
and --layers change it; see docs/performance.md for other sizes). The server is
``python -m shoal.serving --model DIR`` in its own process (one torch thread, as here); the
clients stream ``/generate_stream`` (SSE) from this process, each on its own connection, so the
time to each request's first token is measured where a client sees it. The default client is a
lean one on asyncio streams that still does a real client's work (HTTP/1.1, chunked decoding,
SSE framing, JSON of every event); ``--client httpx`` uses httpx.

Reported: total tokens/s of N concurrent requests of up to M new tokens, against the same N
prompts served one after another with ``generate()`` and all at once with one left-padded
batched ``generate()``; neither side forces a length (a sequence ends at EOS as in
``generate()``; greedy, so both generate the same tokens, and the bench prints both totals).
Each round runs the three (sequential, static batch, server) in a rotating order, and the
medians of the rounds are compared. TTFT p50/p99 of the N concurrent requests against the
median TTFT of a request sent alone (five per round); a request sent while a batch of N
decodes: its TTFT and whether its first token arrived before the batch finished. The CPU
model and the load average are printed with the figures. Files go under
``$SHOAL_HOME/bench`` (or ``~/.cache/shoal-bench``) and are removed; the server is stopped.
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
    """transformers' ``generate()`` on the same weights and prompts, in this process.

    Nothing forces a length: like the server, a sequence ends at EOS or at ``new_tokens``,
    and the tokens counted are those each sequence really generated (greedy, so the server
    generates the same ones: the bench checks the totals agree)."""

    def __init__(self, directory: Path, prompts: list[str], new_tokens: int) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(directory)
        self.model = AutoModelForCausalLM.from_pretrained(directory).eval()
        self.model.generation_config.max_length = None
        self.prompts = prompts
        self.new_tokens = new_tokens
        self.eos = self.model.generation_config.eos_token_id
        self.kw = {"max_new_tokens": new_tokens, "do_sample": False,
                   "pad_token_id": self.tok.pad_token_id}
        self._run([prompts[0]])  # warm-up
        self.total = sum(self._run([p])[1] for p in prompts)

    def _run(self, prompts: list[str]) -> tuple[float, int]:
        """Seconds of one (left-padded) generate() of *prompts*, and the tokens generated."""
        import torch

        self.tok.padding_side = "left"
        batch = self.tok(prompts, return_tensors="pt", padding=True)
        started = time.perf_counter()
        with torch.no_grad():
            out = self.model.generate(**batch, **self.kw)
        seconds = time.perf_counter() - started
        return seconds, sum(self._length(row) for row in out[:, batch["input_ids"].shape[1]:])

    def _length(self, row: Any) -> int:
        """Tokens up to and including the first EOS (the rest is padding)."""
        eos = {self.eos} if isinstance(self.eos, int) else set(self.eos or ())
        ids = row.tolist()
        return next((i + 1 for i, t in enumerate(ids) if t in eos), len(ids))

    def sequential(self) -> float:
        """tokens/s serving the prompts one after another."""
        return self.total / sum(self._run([p])[0] for p in self.prompts)

    def static_batch(self) -> float:
        """tokens/s of one left-padded batched generate() of all the prompts (the ceiling)."""
        seconds, tokens = self._run(self.prompts)
        assert tokens == self.total, (tokens, self.total)
        return self.total / seconds


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


async def concurrent(url: str, prompts: list[str], new_tokens: int, client_kind: str = "raw",
                     lone: int = 5) -> dict[str, object]:
    """One round against the server: *lone* requests one at a time (the TTFT of a request
    alone), the N prompts at once, then the N again with a late request joining."""
    import httpx

    limits = httpx.Limits(max_connections=len(prompts) + 4)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        if client_kind == "httpx":
            def one(prompt: str, n: int) -> Any:
                return _one_httpx(client, prompt, n)
        else:
            one = RawClient(url).one
        await one(prompts[0], 4)  # warm-up
        alone = [await one(prompts[i % len(prompts)], new_tokens) for i in range(lone)]
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
            "lone_ttft_s": statistics.median(r["first"] - r["sent"] for r in alone),
            "late_ttft_s": late["first"] - late["sent"],
            "late_first_token_before_batch_end": late["first"] < batch_end,
            "late_first_token_to_batch_end_s": batch_end - late["first"]}


def cpu_model() -> str:
    """``lscpu``'s model name (the figures depend on it)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown CPU"
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def scratch() -> Path:
    """Where the bench writes: ``$SHOAL_HOME/bench`` when SHOAL_HOME is set, else under
    ``~/.cache`` (where a user's SHOAL_HOME lives; see bench/dispatch.py)."""
    home = os.environ.get("SHOAL_HOME")
    path = Path(home) / "bench" if home else Path.home() / ".cache" / "shoal-bench"
    path.mkdir(parents=True, exist_ok=True)
    return path


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


def _median(values: list[float]) -> float:
    return statistics.median(values)


def _fmt(values: list[float], scale: float = 1.0) -> str:
    return ", ".join(f"{scale * v:.0f}" for v in values)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=128, help="model width (64: shoal.llm's "
                        "tiny default)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--client", choices=("raw", "httpx"), default="raw",
                        help="the streaming client: lean asyncio streams (default) or httpx")
    parser.add_argument("--rounds", type=int, default=5,
                        help="rounds of (sequential generate(), static batch, server), "
                             "interleaved with the order rotating; medians are compared (the "
                             "machine is shared and noisy)")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    with tempfile.TemporaryDirectory(prefix="llm-serving-", dir=scratch()) as tmp:
        directory = build(Path(tmp) / "model", args.hidden, args.layers)
        prompts = _prompts(args.clients)
        base = Baselines(directory, prompts, args.new_tokens)
        proc, url = serve(directory)
        sequential: list[float] = []
        static: list[float] = []
        runs: list[dict[str, object]] = []
        steps = [lambda: sequential.append(base.sequential()),
                 lambda: static.append(base.static_batch()),
                 lambda: runs.append(asyncio.run(concurrent(url, prompts, args.new_tokens,
                                                            args.client)))]
        try:
            for r in range(args.rounds):
                for k in range(len(steps)):
                    steps[(r + k) % len(steps)]()
        finally:
            proc.terminate()
            proc.wait(30)
    tps = [float(r["tps"]) for r in runs]  # type: ignore[arg-type]
    ttft = [float(r["ttft_p50_s"]) for r in runs]  # type: ignore[arg-type]
    lone = [float(r["lone_ttft_s"]) for r in runs]  # type: ignore[arg-type]
    seq, ceiling, served = _median(sequential), _median(static), _median(tps)
    print(f"{args.clients} requests x {args.new_tokens} new tokens (EOS may end one earlier, "
          f"as in generate()), tiny Llama hidden {args.hidden}, {args.layers} layers, torch "
          f"threads {torch.get_num_threads()}, {args.client} client, CPU {cpu_model()}, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; "
          f"{args.rounds} interleaved rounds, medians")
    tokens = {int(r["tokens"]) for r in runs}  # type: ignore[call-overload]
    print(f"  tokens per round: generate() {base.total}, server {sorted(tokens)}"
          f"{'' if tokens == {base.total} else '  (MISMATCH)'}")
    print(f"  generate() one after another : {seq:8.1f} tokens/s (rounds: {_fmt(sequential)})")
    print(f"  one static batched generate(): {ceiling:8.1f} tokens/s (rounds: {_fmt(static)})")
    print(f"  shoal LLM server, concurrent : {served:8.1f} tokens/s (rounds: {_fmt(tps)})")
    print(f"    vs sequential: {served / seq:.2f}x (target >= 5x)")
    print(f"    vs static batch: {100 * served / ceiling:.0f}% (target >= 100%; per round: "
          f"{', '.join(f'{100 * a / b:.0f}%' for a, b in zip(tps, static, strict=True))})")
    print(f"    TTFT p50 with {args.clients} concurrent: {1000 * _median(ttft):.0f} ms "
          f"(rounds: {_fmt(ttft, 1000)}); a lone request: {1000 * _median(lone):.0f} ms "
          f"(rounds: {_fmt(lone, 1000)}); ratio {_median(ttft) / _median(lone):.2f} "
          f"(target <= 2)")
    p99 = [float(r["ttft_p99_s"]) for r in runs]  # type: ignore[arg-type]
    late = [float(r["late_ttft_s"]) for r in runs]  # type: ignore[arg-type]
    before = all(bool(r["late_first_token_before_batch_end"]) for r in runs)
    print(f"    TTFT p99 {1000 * _median(p99):.0f} ms; a request sent while {args.clients} "
          f"decode: TTFT {1000 * _median(late):.0f} ms, first token before the batch "
          f"finished in every round: {before}")


if __name__ == "__main__":
    main()
