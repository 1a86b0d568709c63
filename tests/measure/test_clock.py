"""``tune.clock``: seconds per stage, summed over threads, read as a difference of snapshots."""

import threading
import time

from fastdlight.measure import clock


def test_stages_sum_over_threads_and_waits_are_booked_apart():
    before = clock.snapshot()
    lock = threading.Lock()

    def work():
        with clock.stage("test build"):
            time.sleep(0.05)
        with clock.holding(lock, "test time"):
            time.sleep(0.05)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    spent = clock.since(before)
    assert 0.15 <= spent["test build"] < 3  # three threads' 50 ms each, in parallel
    assert 0.15 <= spent["test time"] < 3  # held one at a time...
    assert spent["gpu wait"] >= 0.05  # ...so two of them waited for the lock
    assert list(spent.values()) == sorted(spent.values(), reverse=True)
    assert "test build" not in clock.since(clock.snapshot())  # nothing spent since
