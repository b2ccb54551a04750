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


def test_request_timings_keep_each_requests_times_in_list_order():
    from tandem.bench.serve.client import RequestRecord

    records = [RequestRecord("p1", "chat", ok=True, ttft_s=0.5, e2e_s=2.0, itl_s=(0.1234567, 0.2),
                             completion_tokens=3, prompt_tokens=40, cached_tokens=20),
               RequestRecord("p0", "code", ok=False, error="HTTP 500", e2e_s=0.1)]
    assert serve_ab.request_timings(records) == [
        {"prompt_id": "p1", "ok": True, "ttft_s": 0.5, "e2e_s": 2.0, "prompt_tokens": 40, "cached_tokens": 20,
         "completion_tokens": 3, "itl_s": [0.12346, 0.2]},
        {"prompt_id": "p0", "ok": False, "ttft_s": None, "e2e_s": 0.1, "prompt_tokens": None,
         "cached_tokens": None, "completion_tokens": 0, "itl_s": []}]


def test_steal_is_read_from_the_kernels_count_and_never_runs_backwards():
    first = serve_ab.steal_seconds()
    with open("/proc/stat") as stat:  # "cpu user nice system idle iowait irq softirq steal ...", in ticks
        ticks = int(stat.readline().split()[8])
    second = serve_ab.steal_seconds()
    hz = os.sysconf("SC_CLK_TCK")
    assert 0 <= first <= second and first - 1 <= ticks / hz <= second + 1
