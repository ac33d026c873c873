"""Run tests.bench.fleet with the client's event loop instrumented (docs/lab/2026-12-03-fleet-loop-lag.md).

A diagnostic, not part of the package: it replaces asyncio's private
``BaseEventLoop._run_once`` (Python 3.11's, copied) with one that times every iteration.
Per iteration: the callbacks' wall time, the loop thread's CPU, its run-queue wait
(/proc schedstat), the garbage collector's pauses in it; per handle: time by task/callback.
Usage, from a checkout: ``PYTHONPATH=$PWD .venv/bin/python docs/bench/fleet-loop-probe.py
--tickers 500 --endpoints 8 --speedup 1 --output-scale 0.2``. Env: PROBE_OUT (JSON path),
PROBE_DEBUG=1 (asyncio debug, slow_callback_duration 0.05), PROBE_SERVER_CPUS (taskset -c
for the endpoints' process), PROBE_GC (gc thresholds "a,b,c" at the arm's start),
PROBE_SAVEALL=1 (gc.DEBUG_SAVEALL; the cyclic garbage's types in the JSON).
"""
import asyncio
import collections
import gc
import heapq
import json
import logging
import os
import sys
import threading
import time
from asyncio import base_events

OUT = os.environ.get("PROBE_OUT", "/tmp/lagprobe/probe.json")
DEBUG = os.environ.get("PROBE_DEBUG") == "1"

gc_state = {"t0": 0.0, "pause": 0.0, "by_gen": collections.defaultdict(list)}


def _gc_cb(phase, info):
    if threading.get_ident() != MAIN:
        return
    if phase == "start":
        if info["generation"] == 2:
            gc_state["g2size"] = len(gc.get_objects(generation=2))
        gc_state["t0"] = time.perf_counter()
    else:
        dt = time.perf_counter() - gc_state["t0"]
        gc_state["pause"] += dt
        gc_state["by_gen"][info["generation"]].append(dt)
        gc_state.setdefault("collected", collections.defaultdict(int))[info["generation"]] += info["collected"]
        if info["generation"] == 2:
            gc_state.setdefault("g2", []).append((round(dt, 4), gc_state["g2size"], info["collected"], gc.get_freeze_count()))


MAIN = threading.get_ident()
gc.callbacks.append(_gc_cb)

TID = threading.get_native_id()


def schedstat():
    with open(f"/proc/self/task/{TID}/schedstat") as f:
        run_ns, wait_ns, _ = f.read().split()
    return int(run_ns) / 1e9, int(wait_ns) / 1e9


def key_of(handle):
    cb = handle._callback
    owner = getattr(cb, "__self__", None)
    if isinstance(owner, asyncio.Task):
        coro = owner.get_coro()
        inner = coro
        for _ in range(30):
            nxt = getattr(inner, "cr_await", None) or getattr(inner, "ag_await", None)
            if nxt is None or not (hasattr(nxt, "cr_frame") or hasattr(nxt, "ag_frame")):
                break
            inner = nxt
        return f"task:{getattr(coro, '__qualname__', coro)}>{getattr(inner, '__qualname__', inner)}"
    return f"cb:{getattr(cb, '__qualname__', repr(cb))}"


iters = []  # (t, busy_wall, cpu, rq_wait, gc, n_handles, n_events)
slow_handles = collections.Counter()
slow_handle_time = collections.defaultdict(float)
all_time = collections.defaultdict(float)
all_count = collections.Counter()
long_iter_mix = collections.defaultdict(float)  # key -> time inside iterations > 50 ms
long_iter_count = collections.Counter()
state = {"select_dur": 0.0, "events": 0, "wrapped": False}


def _run_once(self):
    if not state["wrapped"]:
        sel = self._selector.select

        def timed_select(timeout=None):
            t = time.perf_counter()
            r = sel(timeout)
            state["select_dur"] = time.perf_counter() - t
            state["events"] = len(r)
            return r
        self._selector.select = timed_select
        state["wrapped"] = True
    sched_count = len(self._scheduled)
    if (sched_count > base_events._MIN_SCHEDULED_TIMER_HANDLES and
            self._timer_cancelled_count / sched_count >
            base_events._MIN_CANCELLED_TIMER_HANDLES_FRACTION):
        new_scheduled = []
        for handle in self._scheduled:
            if handle._cancelled:
                handle._scheduled = False
            else:
                new_scheduled.append(handle)
        heapq.heapify(new_scheduled)
        self._scheduled = new_scheduled
        self._timer_cancelled_count = 0
    else:
        while self._scheduled and self._scheduled[0]._cancelled:
            self._timer_cancelled_count -= 1
            handle = heapq.heappop(self._scheduled)
            handle._scheduled = False
    timeout = None
    if self._ready or self._stopping:
        timeout = 0
    elif self._scheduled:
        when = self._scheduled[0]._when
        timeout = min(max(0, when - self.time()), base_events.MAXIMUM_SELECT_TIMEOUT)
    event_list = self._selector.select(timeout)
    t_start = time.perf_counter()
    cpu0 = time.thread_time()
    rs0 = schedstat()
    gc0 = gc_state["pause"]
    self._process_events(event_list)
    event_list = None
    end_time = self.time() + self._clock_resolution
    while self._scheduled:
        handle = self._scheduled[0]
        if handle._when >= end_time:
            break
        handle = heapq.heappop(self._scheduled)
        handle._scheduled = False
        self._ready.append(handle)
    ntodo = len(self._ready)
    mix = []
    for i in range(ntodo):
        handle = self._ready.popleft()
        if handle._cancelled:
            continue
        k = key_of(handle)
        t0 = time.perf_counter()
        if self._debug:
            try:
                self._current_handle = handle
                handle._run()
            finally:
                self._current_handle = None
            dt = time.perf_counter() - t0
            if dt >= self.slow_callback_duration:
                base_events.logger.warning('Executing %s took %.3f seconds',
                                           base_events._format_handle(handle), dt)
        else:
            handle._run()
            dt = time.perf_counter() - t0
        all_time[k] += dt
        all_count[k] += 1
        mix.append((k, dt))
        if dt >= 0.05:
            slow_handles[k] += 1
            slow_handle_time[k] += dt
    handle = None
    busy = time.perf_counter() - t_start
    rs1 = schedstat()
    cpu = time.thread_time() - cpu0
    iters.append((t_start, busy, cpu, rs1[1] - rs0[1], gc_state["pause"] - gc0, ntodo,
                  state["events"], state["select_dur"]))
    if busy >= 0.05:
        for k, dt in mix:
            long_iter_mix[k] += dt
            long_iter_count[k] += 1


base_events.BaseEventLoop._run_once = _run_once

_orig_run = asyncio.run


def run(main, *, debug=None):
    async def wrapped():
        loop = asyncio.get_running_loop()
        if DEBUG:
            loop.set_debug(True)
            loop.slow_callback_duration = 0.05
        gc_state["objects_start"] = len(gc.get_objects())
        if os.environ.get("PROBE_GC"):
            gc.set_threshold(*map(int, os.environ["PROBE_GC"].split(",")))
        if os.environ.get("PROBE_SAVEALL"):
            gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            return await main
        finally:
            gc_state["objects_end"] = len(gc.get_objects())
    try:
        return _orig_run(wrapped(), debug=debug)
    finally:
        dump()


def dump():
    import numpy as np
    a = np.array(iters) if iters else np.zeros((0, 8))
    busy = a[:, 1]
    long = a[busy >= 0.05]
    def pct(x, q):
        return float(np.percentile(x, q)) if len(x) else None
    res = {
        "iterations": len(a), "objects_start": gc_state.get("objects_start"), "objects_end": gc_state.get("objects_end"),
        "busy_total_s": float(busy.sum()), "cpu_total_s": float(a[:, 2].sum()),
        "rq_wait_total_s": float(a[:, 3].sum()), "gc_total_s": float(a[:, 4].sum()),
        "select_total_s": float(a[:, 7].sum()),
        "busy_p50": pct(busy, 50), "busy_p99": pct(busy, 99), "busy_max": float(busy.max()) if len(busy) else None,
        "long_iterations(>=50ms)": len(long),
        "long_busy_s": float(long[:, 1].sum()), "long_cpu_s": float(long[:, 2].sum()),
        "long_rq_wait_s": float(long[:, 3].sum()), "long_gc_s": float(long[:, 4].sum()),
        "long_handles_mean": float(long[:, 5].mean()) if len(long) else None,
        "long_events_mean": float(long[:, 6].mean()) if len(long) else None,
        "handles_per_iter_mean": float(a[:, 5].mean()) if len(a) else None,
        "gc": {str(g): {"n": len(v), "total_s": sum(v), "max_s": max(v)} for g, v in gc_state["by_gen"].items()},
        "collected": dict(gc_state.get("collected", {})), "g2": gc_state.get("g2", []),
        "slow_handles(>=50ms)": {k: [n, slow_handle_time[k]] for k, n in slow_handles.most_common(30)},
        "time_by_key_top": sorted(((k, all_time[k], all_count[k]) for k in all_time), key=lambda x: -x[1])[:30],
        "time_in_long_iters_by_key": sorted(((k, long_iter_mix[k], long_iter_count[k]) for k in long_iter_mix), key=lambda x: -x[1])[:30],
        "longest_iterations": sorted(([float(x) for x in r] for r in a), key=lambda r: -r[1])[:40],
    }
    if os.environ.get("PROBE_SAVEALL"):
        gc.set_debug(0)
        gc.collect()
        res["garbage_types"] = collections.Counter(
            f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.garbage).most_common(60)
        fr = collections.Counter()
        for o in gc.garbage:
            if type(o).__name__ == "frame":
                fr[f"{o.f_code.co_filename.split('site-packages/')[-1]}:{o.f_code.co_name}"] += 1
            if type(o).__name__ in ("coroutine", "async_generator", "generator"):
                fr[f"{type(o).__name__}:{o.__qualname__}"] += 1
        res["garbage_frames"] = fr.most_common(40)
        res["garbage_n"] = len(gc.garbage)
    with open(OUT, "w") as f:
        json.dump(res, f, indent=1)


asyncio.run = run

if os.environ.get("PROBE_SERVER_CPUS"):
    import subprocess
    _Popen = subprocess.Popen

    class PinnedPopen(_Popen):
        def __init__(self, args, *a, **k):
            if isinstance(args, list) and "tests.fakevllm.stepped" in args:
                args = ["taskset", "-c", os.environ["PROBE_SERVER_CPUS"], *args]
            super().__init__(args, *a, **k)
    subprocess.Popen = PinnedPopen

if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("asyncio").setLevel(logging.WARNING)
    from tests.bench import fleet as fleetmod, run as runbench
    runbench(fleetmod.app)
