"""scripts/serve_ab.py's per-thread CPU reading: the threads that ran between two readings,
busiest first, a process's first thread marked, idle ones and gone ones left out; and its line
on Tandem's engine steps."""

import importlib.util
import os
import threading
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "serve_ab.py"
spec = importlib.util.spec_from_file_location("serve_ab", SCRIPT)
serve_ab = importlib.util.module_from_spec(spec)
spec.loader.exec_module(serve_ab)


def test_busy_threads_orders_by_cpu_and_marks_the_main_thread():
    before = {(10, 10): 1.0, (10, 11): 5.0, (10, 12): 2.0, (10, 13): 7.0}
    after = {(10, 10): 1.4, (10, 11): 9.0, (10, 12): 2.01, (10, 14): 0.3}  # 13 ended, 14 started
    assert serve_ab.busy_threads(before, after) == [
        {"cpu_s": 4.0, "main": False}, {"cpu_s": 0.4, "main": True}, {"cpu_s": 0.3, "main": False}]


def test_a_spinning_thread_of_this_process_is_read_as_busy():
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            pass

    before = serve_ab.thread_cpu_seconds(os.getpid())
    worker = threading.Thread(target=spin)
    worker.start()
    time.sleep(0.5)
    after = serve_ab.thread_cpu_seconds(os.getpid())
    stop.set()
    worker.join()
    assert (os.getpid(), os.getpid()) in after  # the main thread is keyed (pid, pid)
    busy = serve_ab.busy_threads(before, after)
    assert busy and busy[0]["cpu_s"] >= 0.05


def test_the_engine_line_gives_the_steps_time_outside_the_verify_calls():
    steps = {"steps": 200, "prompt_steps": 20, "step_s": 60.8, "draft_s": 0.0, "verify_s": 60.0}
    line = serve_ab.engine_line(steps)
    assert "200 steps" in line and "0.80 s outside them (4.00 ms a step)" in line
    assert "(0.00 ms a step)" in serve_ab.engine_line({**steps, "steps": 0, "step_s": 0.0, "verify_s": 0.0})
