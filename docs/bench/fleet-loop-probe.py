"""Run tests.bench.fleet, its client's event loop timed (docs/lab/2026-12-03-fleet-loop-lag.md).

A diagnostic, not part of the package. It wraps asyncio, copying and replacing none of it:
``Handle._run`` is called through a timer that charges each handle to its task or callback,
and the loop's ``selector.select`` through one that marks the iterations, an iteration's
busy time running from a select's return to the next select (or the loop's stop). Per
iteration: that wall time, the loop thread's CPU, its run-queue wait (/proc schedstat), the
garbage collector's pauses in it (gc.callbacks), the handles run, the events, the select's wait.
Usage, from a checkout: ``PYTHONPATH=$PWD .venv/bin/python docs/bench/fleet-loop-probe.py
--tickers 500 --endpoints 8 --speedup 1 --output-scale 0.2``. Env: PROBE_OUT (JSON path),
PROBE_DEBUG=1 (asyncio debug, slow_callback_duration 0.05), PROBE_SERVER_CPUS (taskset -c
for the endpoints' process), PROBE_GC (gc thresholds "a,b,c" at the arm's start),
PROBE_SAVEALL=1 (gc.DEBUG_SAVEALL; the cyclic garbage's types in the JSON).
"""

import asyncio
import collections
import gc
import json
import logging
import os
import sys
import threading
import time
from asyncio import events

OUT = os.environ.get("PROBE_OUT", "/tmp/lagprobe/probe.json")
DEBUG = os.environ.get("PROBE_DEBUG") == "1"
SLOW = 0.05  # an iteration or a handle this long (s) is a long one

MAIN = threading.get_ident()
TID = threading.get_native_id()

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
        collected = gc_state.setdefault("collected", collections.defaultdict(int))
        collected[info["generation"]] += info["collected"]
        if info["generation"] == 2:
            gc_state.setdefault("g2", []).append(
                (round(dt, 4), gc_state["g2size"], info["collected"], gc.get_freeze_count()))


gc.callbacks.append(_gc_cb)


def schedstat():
    """The main thread's CPU and run-queue wait so far, in seconds."""
    with open(f"/proc/self/task/{TID}/schedstat") as f:
        run_ns, wait_ns, _ = f.read().split()
    return int(run_ns) / 1e9, int(wait_ns) / 1e9


def key_of(handle):
    """A handle's name: its task's coroutine and the innermost one it awaits, or its callback."""
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


iters = []  # (t, busy_wall, cpu, rq_wait, gc, n_handles, n_events, select_wait)
slow_handles = collections.Counter()
slow_handle_time = collections.defaultdict(float)
all_time = collections.defaultdict(float)
all_count = collections.Counter()
long_iter_mix = collections.defaultdict(float)  # key -> time inside iterations > 50 ms
long_iter_count = collections.Counter()


class Iteration:
    """The instrumented loop and its open iteration: marks at its start, handles run so far."""

    def __init__(self):
        self.loop, self.open, self.events, self.mix = None, False, 0, []
        self.t0 = self.cpu0 = self.rq0 = self.gc0 = self.select_wait = 0.0


it = Iteration()


def begin(t, n_events, select_wait):
    it.t0, it.cpu0, it.rq0, it.gc0 = t, time.thread_time(), schedstat()[1], gc_state["pause"]
    it.events, it.select_wait, it.mix, it.open = n_events, select_wait, [], True


def end():
    if not it.open:
        return
    it.open = False
    busy = time.perf_counter() - it.t0
    rq = schedstat()[1] - it.rq0
    cpu = time.thread_time() - it.cpu0
    iters.append((it.t0, busy, cpu, rq, gc_state["pause"] - it.gc0, len(it.mix), it.events,
                  it.select_wait))
    if busy >= SLOW:
        for k, dt in it.mix:
            long_iter_mix[k] += dt
            long_iter_count[k] += 1


def instrument(loop):
    """Time this loop's selects and close its last iteration when it stops (instance wrappers)."""
    select, run_forever = loop._selector.select, loop.run_forever

    def timed_select(timeout=None):
        # The span closed here also holds the loop's timer bookkeeping before this select.
        end()
        t = time.perf_counter()
        ready = select(timeout)
        now = time.perf_counter()
        begin(now, len(ready), now - t)
        return ready

    def timed_run_forever():
        try:
            return run_forever()
        finally:
            end()

    loop._selector.select = timed_select
    loop.run_forever = timed_run_forever
    it.loop, it.open = loop, False


_handle_run = events.Handle._run


def timed_handle_run(self):
    """Handle._run, timed and charged to the handle's name when it runs on the probed loop."""
    if self._loop is not it.loop or not it.open:
        return _handle_run(self)
    k = key_of(self)
    t0 = time.perf_counter()
    try:
        return _handle_run(self)
    finally:
        dt = time.perf_counter() - t0
        all_time[k] += dt
        all_count[k] += 1
        it.mix.append((k, dt))
        if dt >= SLOW:
            slow_handles[k] += 1
            slow_handle_time[k] += dt


events.Handle._run = timed_handle_run  # TimerHandle inherits it


def new_loop():
    loop = asyncio.new_event_loop()
    instrument(loop)
    return loop


def run(main, *, debug=None):
    """asyncio.run's contract, on an instrumented loop; the figures dumped after."""
    async def wrapped():
        loop = asyncio.get_running_loop()
        if DEBUG:
            loop.set_debug(True)
            loop.slow_callback_duration = SLOW
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
        with asyncio.Runner(debug=debug, loop_factory=new_loop) as runner:
            return runner.run(wrapped())
    finally:
        dump()


def dump():
    import numpy as np
    a = np.array(iters) if iters else np.zeros((0, 8))
    busy = a[:, 1]
    long = a[busy >= SLOW]

    def pct(x, q):
        return float(np.percentile(x, q)) if len(x) else None

    def by_time(times, counts):
        return sorted(((k, times[k], counts[k]) for k in times), key=lambda x: -x[1])[:30]
    res = {
        "iterations": len(a), "objects_start": gc_state.get("objects_start"),
        "objects_end": gc_state.get("objects_end"),
        "busy_total_s": float(busy.sum()), "cpu_total_s": float(a[:, 2].sum()),
        "rq_wait_total_s": float(a[:, 3].sum()), "gc_total_s": float(a[:, 4].sum()),
        "select_total_s": float(a[:, 7].sum()),
        "busy_p50": pct(busy, 50), "busy_p99": pct(busy, 99),
        "busy_max": float(busy.max()) if len(busy) else None,
        "long_iterations(>=50ms)": len(long),
        "long_busy_s": float(long[:, 1].sum()), "long_cpu_s": float(long[:, 2].sum()),
        "long_rq_wait_s": float(long[:, 3].sum()), "long_gc_s": float(long[:, 4].sum()),
        "long_handles_mean": float(long[:, 5].mean()) if len(long) else None,
        "long_events_mean": float(long[:, 6].mean()) if len(long) else None,
        "handles_per_iter_mean": float(a[:, 5].mean()) if len(a) else None,
        "gc": {str(g): {"n": len(v), "total_s": sum(v), "max_s": max(v)}
               for g, v in gc_state["by_gen"].items()},
        "collected": dict(gc_state.get("collected", {})), "g2": gc_state.get("g2", []),
        "slow_handles(>=50ms)": {k: [n, slow_handle_time[k]]
                                 for k, n in slow_handles.most_common(30)},
        "time_by_key_top": by_time(all_time, all_count),
        "time_in_long_iters_by_key": by_time(long_iter_mix, long_iter_count),
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
    os.makedirs(os.path.dirname(OUT) or ".", exist_ok=True)
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
    from tests.bench import fleet as fleetmod
    from tests.bench import run as runbench
    runbench(fleetmod.app)
