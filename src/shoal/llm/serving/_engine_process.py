"""The transformers engine in a process of its own (``option.shoal_engine_process``).

In one process, the server's event loop (HTTP, JSON, SSE, tokenizing) and the engine's thread
(the model's forward, wrapped in Python) share one GIL: under load each waits for the other,
and a burst's intake slows its own prefill. Here the engine runs in a child process
(``python -m shoal.llm.serving._engine_process``, started by :class:`EngineProcess`) and the
server keeps a stand-in with the engine's interface (``submit``, ``queue_depth``, ``live``,
``on_step``, ``stop``).

The two talk over a socket pair with pickled messages (``multiprocessing.connection``):

- server to engine: ``("submit", id, prompt ids, params)``, ``("cancel", id)``, ``("stop",)``;
- engine to server: during the load ``("log", level, logger, message)`` and then
  ``("ready", vocab size, description)`` or ``("error", exception)``; then,
  once per engine step hand-over (``on_step``), ``("step", events, observer calls)``.

A reader thread in the server turns each step message into ``TokenEvent`` calls of the
generations' callbacks and the engine observer's calls (the server's metrics), then calls
``on_step``, as the in-process engine's thread does. The queue limit is kept on the server's
side (requests sent that have no token yet), so a full queue is a 503 at once. An engine
process that dies fails its open requests with its exit status, and later ones at submit.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from shoal.errors import ModelLoadError
from shoal.llm.serving._engine import EngineObserver, FinishReason, TokenEvent, overloaded
from shoal.llm.serving._params import GenerationParams

__all__ = ["EngineProcess"]

log = logging.getLogger(__name__)

#: the engine observer's methods, forwarded from the engine process with each step
_OBSERVED = ("step", "prefilled", "first_token", "inter_token", "finished")


class RemoteGeneration:
    """The server's handle of one generation in the engine process; ``cancel()`` frees its
    slot there."""

    __slots__ = ("_engine", "cancelled", "emitted", "finished", "id", "on_event", "params",
                 "seed", "submitted_at")

    def __init__(self, engine: EngineProcess, gid: int, params: GenerationParams,
                 on_event: Callable[[TokenEvent], None]) -> None:
        self._engine = engine
        self.id = gid
        self.params = params
        self.on_event = on_event
        self.seed: int | None = params.seed
        self.cancelled = False
        self.emitted = False
        self.finished = False
        self.submitted_at = time.perf_counter()

    def cancel(self) -> None:
        if self.cancelled or self.finished:
            return
        self.cancelled = True
        self._engine._cancel(self)


class EngineProcess:
    """The engine, run by a child process; the interface of ``TransformersEngine`` that the
    server uses. ``spawn`` starts the child, ``load`` waits until its model is loaded
    (raising its ``ModelLoadError``), ``start`` begins reading its steps."""

    def __init__(self, *, max_queue: int, observer: EngineObserver | None = None,
                 on_step: Callable[[], None] | None = None) -> None:
        self.max_queue = max_queue
        self.observer = observer or EngineObserver()
        self.on_step = on_step
        #: told (on the reader's thread) why, when the engine process ends unasked
        self.on_exit: Callable[[str], None] | None = None
        self.vocab_size = 0
        self.description = ""
        self._gens: dict[int, RemoteGeneration] = {}
        self._next_id = 0
        self._waiting = 0  # sent, no token yet
        self._live = 0  # a token, not finished
        self._lock = threading.Lock()  # _gens, the counts, sends
        self._conn: Any = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self._gone: str | None = None  # why the engine process is no longer there

    # --- the interface the server uses -------------------------------------------------------

    @property
    def queue_depth(self) -> int:
        return self._waiting

    @property
    def live(self) -> int:
        return self._live

    def submit(self, prompt_ids: Sequence[int], params: GenerationParams,
               on_event: Callable[[TokenEvent], None]) -> RemoteGeneration:
        with self._lock:
            if self._gone is not None:
                raise RuntimeError(self._gone)
            if self._waiting >= self.max_queue:
                raise overloaded(self._waiting, self.max_queue)
            if params.do_sample and params.seed is None:  # chosen here, so it is known here
                params = dataclasses.replace(params, seed=random.randrange(2**63))
            self._next_id += 1
            g = RemoteGeneration(self, self._next_id, params, on_event)
            self._gens[g.id] = g
            self._waiting += 1
            self._conn.send(("submit", g.id, list(prompt_ids), params))
        return g

    def spawn(self, path: os.PathLike[str] | str, *, trust_remote_code: bool = False) -> None:
        """Start the engine process: meanwhile it imports torch and transformers and reads
        the config and the tokenizer at *path* (the model directory)."""
        import multiprocessing.connection as mpc

        parent, child = socket.socketpair()
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "shoal.llm.serving._engine_process", str(child.fileno()),
                 os.fspath(path), "1" if trust_remote_code else "0"],
                pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL)
        finally:
            child.close()
        self._conn = mpc.Connection(parent.detach())

    def pause(self) -> None:
        """Hold the engine after its current iteration (tests use it to queue requests up)."""
        self._send(("pause",))

    def resume(self) -> None:
        self._send(("resume",))

    def _send(self, message: tuple[Any, ...]) -> None:
        with self._lock:
            if self._gone is None:
                try:
                    self._conn.send(message)
                except OSError:
                    pass

    def load(self, spec: dict[str, Any]) -> None:
        """Load the model *spec* describes in the engine process and wait for it (its log
        lines are logged here); raises its ``ModelLoadError``."""
        assert self._proc is not None and self._conn is not None, "spawn() first"
        self._conn.send(("load", spec, logging.getLogger().getEffectiveLevel()))
        while True:
            try:
                message = self._conn.recv()
            except (EOFError, OSError):
                code = self._proc.wait()
                raise ModelLoadError(f"the engine process exited with status {code} while "
                                     f"loading the model from {spec['path']}",
                                     path=str(spec["path"])) from None
            kind = message[0]
            if kind == "log":
                _log(message)
            elif kind == "ready":
                _, self.vocab_size, self.description = message
                return
            elif kind == "error":
                self._proc.wait()
                raise message[1]

    def start(self) -> None:
        self._reader = threading.Thread(target=self._read, name="shoal-llm-engine-reader",
                                        daemon=True)
        self._reader.start()

    def stop(self, timeout_s: float = 10) -> None:
        """End the engine process (at once when it has no model yet), failing what is open."""
        if self._proc is not None and self._reader is None:  # never served: nothing to finish
            self._gone = self._gone or "the server is shutting down"
            self._proc.kill()
            self._proc.wait()
            return
        with self._lock:
            if self._gone is None:
                self._gone = "the server is shutting down"
                try:
                    self._conn.send(("stop",))
                except OSError:
                    pass
        if self._proc is not None:
            try:
                self._proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._reader is not None:
            self._reader.join(timeout_s)
        self._fail_open("the server is shutting down")

    # --- the reader ---------------------------------------------------------------------------

    def _read(self) -> None:
        observer = self.observer
        while True:
            try:
                message = self._conn.recv()
            except (EOFError, OSError):
                break
            kind = message[0]
            if kind == "step":
                _, events, calls = message
                for name, args in calls:
                    getattr(observer, name)(*args)
                self._deliver(events)
                if self.on_step is not None:
                    try:
                        self.on_step()
                    except Exception:
                        log.exception("handing a step's events on failed")
            elif kind == "log":
                _log(message)
        code = self._proc.wait() if self._proc is not None else None
        with self._lock:
            stopping = self._gone is not None
            if not stopping:
                self._gone = (f"the engine process exited with status {code}; restart the "
                              f"server")
        if not stopping:
            why = self._gone or "the engine process exited"
            log.error("%s", why)
            self._fail_open(why)
            if self.on_step is not None:
                self.on_step()
            if self.on_exit is not None:
                self.on_exit(why)

    def _deliver(self, events: list[tuple[Any, ...]]) -> None:
        """A step's events to their generations' callbacks; the events of one cancelled
        meanwhile (no longer in ``_gens``) are dropped, as the engine drops its row."""
        gens = self._gens
        for gid, token, text, logprob, special, finish, full, error, top in events:
            g = gens.get(gid)
            if g is None:
                continue
            ended = finish is not None or error is not None
            if ended or not g.emitted:
                with self._lock:  # the counts change with _gens, as cancel() changes them
                    if gens.get(gid) is not g:
                        continue
                    if not g.emitted:
                        g.emitted = True
                        self._waiting -= 1
                        self._live += 1
                    if ended:
                        g.finished = True
                        del gens[gid]
                        self._live -= 1
            event = TokenEvent(token, text, logprob, special,
                               None if finish is None else FinishReason(finish), full, error,
                               top)
            try:
                g.on_event(event)
            except Exception:
                log.exception("delivering a token of generation %s failed; cancelling it", gid)
                g.cancel()

    def _cancel(self, g: RemoteGeneration) -> None:
        """*g* leaves now (the engine retires its row at its next step, telling nobody)."""
        with self._lock:
            if self._gens.pop(g.id, None) is not None:
                if g.emitted:
                    self._live -= 1
                else:
                    self._waiting -= 1
        self._send(("cancel", g.id))

    def _fail_open(self, why: str) -> None:
        with self._lock:
            open_ = list(self._gens.values())
            self._gens.clear()
            self._waiting = self._live = 0
        for g in open_:
            g.finished = True
            self.observer.finished(time.perf_counter() - g.submitted_at, "abort")
            try:
                g.on_event(TokenEvent(-1, "", 0.0, False, error=why))
            except Exception:
                log.exception("failing generation %s", g.id)


# --- the engine process ---------------------------------------------------------------------


def _log(message: tuple[Any, ...]) -> None:
    """A log record of the engine process, logged here under its logger's name."""
    _, level, name, text = message
    logging.getLogger(name).log(level, "%s", text)


class _Recorder(EngineObserver):
    """The engine's observer in the child: its calls (``_OBSERVED``) go with the next step
    message."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []


def _recording(name: str) -> Callable[..., None]:
    def record(self: _Recorder, *args: Any) -> None:
        self.calls.append((name, args))
    record.__name__ = name
    return record


for _name in _OBSERVED:
    setattr(_Recorder, _name, _recording(_name))


class _Forward(logging.Handler):
    def __init__(self, send: Callable[[tuple[Any, ...]], None]) -> None:
        super().__init__()
        self._send = send

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._send(("log", record.levelno, record.name, self.format(record)))
        except Exception:  # the server is gone: nothing to tell
            pass


def _warm(path: str, trust_remote_code: bool) -> Any:
    """What the load needs first, while the server decides how to load: torch,
    transformers, the model's config (importing its modelling code) and the tokenizer."""
    try:
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # noqa: F401

        AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
        return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except Exception:  # the server's own read reports what is wrong
        return None


def _child(fd: int, path: str, trust_remote_code: bool) -> None:
    import multiprocessing.connection as mpc

    conn = mpc.Connection(fd)
    lock = threading.Lock()
    tokenizer = _warm(path, trust_remote_code)

    def send(message: tuple[Any, ...]) -> None:
        with lock:
            conn.send(message)

    try:
        message = conn.recv()
    except (EOFError, OSError):
        return
    if message[0] != "load":
        return
    _, spec, level = message
    root = logging.getLogger()
    root.setLevel(level)
    handler = _Forward(send)
    handler.setFormatter(logging.Formatter("%(message)s"))
    root.addHandler(handler)
    try:
        from shoal.llm.serving._loading import load_causal_lm

        model, tokenizer, description = load_causal_lm(spec, tokenizer)
    except ModelLoadError as e:
        send(("error", e))
        return
    except BaseException as e:  # the model's own code or its files: said with the path
        send(("error", ModelLoadError(f"cannot load the model from {spec['path']}: "
                                      f"{type(e).__name__}: {e}", path=str(spec["path"]))))
        return

    from shoal.llm.serving._engine import TransformersEngine

    recorder = _Recorder()
    events: list[tuple[Any, ...]] = []

    def on_step() -> None:
        nonlocal events
        batch, events = events, []
        calls, recorder.calls = recorder.calls, []
        if batch or calls:
            send(("step", batch, calls))

    engine = TransformersEngine(model, tokenizer, max_batch=int(spec["max_batch"]),
                                max_queue=1 << 30, max_model_len=int(spec["max_model_len"]),
                                observer=recorder, on_step=on_step)
    send(("ready", engine.vocab_size, description))
    engine.start()
    gens: dict[int, Any] = {}

    def collect(gid: int) -> Callable[[TokenEvent], None]:
        def on_event(e: TokenEvent) -> None:
            events.append((gid, e.token_id, e.text, e.logprob, e.special,
                           None if e.finish is None else e.finish.value, e.generated_text,
                           e.error, e.top))
            if e.finish is not None or e.error is not None:
                gens.pop(gid, None)
        return on_event

    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            break
        kind = message[0]
        if kind == "submit":
            _, gid, ids, params = message
            gens[gid] = engine.submit(ids, params, collect(gid))
        elif kind == "cancel":
            g = gens.get(message[1])
            if g is not None:
                g.cancel()
        elif kind == "pause":
            engine.pause()
        elif kind == "resume":
            engine.resume()
        elif kind == "stop":
            break
    engine.stop()


if __name__ == "__main__":
    _child(int(sys.argv[1]), sys.argv[2], sys.argv[3] == "1")
