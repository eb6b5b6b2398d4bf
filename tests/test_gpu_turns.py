"""Turns on the GPU for compile children side by side (pure logic, real threads)."""

from __future__ import annotations

import threading
import time

from jaxfit.fit.gpu_turns import Turns


def test_a_timing_waits_for_the_autotuning_in_flight_and_holds_back_new_autotuning():
    """Two autotune together; a timing that asks meanwhile waits for both, and an autotuning that
    asks while the timing waits starts only after it: nothing runs beside a timing."""
    turns = Turns()
    log: list[str] = []
    lock = threading.Lock()

    def note(what: str) -> None:
        with lock:
            log.append(what)

    def autotune(name: str, seconds: float) -> None:
        with turns.autotuning():
            note(f"{name} start")
            time.sleep(seconds)
            note(f"{name} end")

    def timing() -> None:
        with turns.timing():
            note("timing start")
            time.sleep(0.2)
            note("timing end")

    a = threading.Thread(target=autotune, args=("a", 0.3))
    b = threading.Thread(target=autotune, args=("b", 0.4))
    a.start()
    b.start()
    time.sleep(0.1)  # both autotune now
    t = threading.Thread(target=timing)
    t.start()
    time.sleep(0.1)  # the timing waits
    c = threading.Thread(target=autotune, args=("c", 0.1))
    c.start()
    for thread in (a, b, t, c):
        thread.join(5)
    assert log[:2] == ["a start", "b start"]
    assert log.index("timing start") > max(log.index("a end"), log.index("b end"))
    assert log.index("c start") > log.index("timing end")  # held back while the timing waited and ran


def test_timings_take_turns_with_each_other():
    turns = Turns()
    inside = []
    most = []

    def timing() -> None:
        with turns.timing():
            inside.append(1)
            most.append(len(inside))
            time.sleep(0.05)
            inside.pop()

    threads = [threading.Thread(target=timing) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5)
    assert most == [1, 1, 1, 1]
