"""``Signals.wait``: a wake-up fired from another thread just before the waiter registers
is not lost when the waiter says what it waits for (``ready``)."""

from __future__ import annotations

import asyncio
import threading

from shoal.server._signals import Signals


def test_a_fire_before_the_wait_registers_is_not_lost_with_ready():
    signals = Signals()
    messages: list[str] = []

    async def poll() -> list[str]:
        await signals.wait("warm-up", 0.0)  # binds the loop, as the first request does
        seen = len(messages)  # the route's own check: nothing yet
        fired = threading.Thread(target=lambda: (messages.append("result"),
                                                 signals.fire(["launch:x"])))
        fired.start()
        fired.join()  # the fire happened before this waiter registered: nobody was woken
        # A 60 s slice: without the re-check it would sleep all of it (wait_for ends it).
        await asyncio.wait_for(signals.wait("launch:x", 60.0,
                                            ready=lambda: len(messages) > seen), 20.0)
        return messages

    assert asyncio.run(poll()) == ["result"]


def test_a_fire_after_the_wait_registers_wakes_it():
    signals = Signals()

    async def poll() -> bool:
        await signals.wait("warm-up", 0.0)
        loop = asyncio.get_running_loop()
        loop.call_later(0.05, lambda: threading.Thread(
            target=signals.fire, args=(["launch:y"],)).start())
        await asyncio.wait_for(signals.wait("launch:y", 60.0, ready=lambda: False), 20.0)
        return True

    assert asyncio.run(poll())
