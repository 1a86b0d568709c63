"""The CLI's first tune (fastdlight tune matmul 4096 4096 4096 --dtype float16) with a timeline:
stage events, worker start/ready and each build's phases, seconds from process start. Nothing
heavy is imported before the CLI starts its workers (the hooks go in once cli._workload ran)."""
import time
T0, T0_EPOCH = time.perf_counter(), time.time()
import sys, threading, os
from contextlib import contextmanager
sys.modules.setdefault("torch", None)
from fastdlight import cli
from fastdlight.tune import workers as _w
cli._STARTED.append((T0, T0_EPOCH))
MARK = [("cli imported", time.perf_counter())]
EV = []
CAP = []
_imap = _w.WorkerPool.imap_unordered
def imap(self, tasks, *a, **k):
    tasks = list(tasks)
    MARK.append((f"imap_unordered {len(tasks)} tasks", time.perf_counter()))
    return _imap(self, tasks, *a, **k)
_w.WorkerPool.imap_unordered = imap
_start = _w._Worker.start
def wstart(self):
    MARK.append((f"worker {self.slot} start", time.perf_counter()))
    _start(self)
    MARK.append((f"worker {self.slot} ready", time.perf_counter()))
_w._Worker.start = wstart

def install_hooks():
    from fastdlight.tune import clock, candidates
    _orig = clock.stage
    @contextmanager
    def stage(name):
        t0 = time.perf_counter()
        with _orig(name):
            yield
        EV.append((name, t0, time.perf_counter(), threading.current_thread().name))
    clock.stage = stage
    _hold = clock.holding
    @contextmanager
    def holding(lock, name):
        with _hold(lock, name):
            t1 = time.perf_counter()
            yield
        EV.append((name, t1, time.perf_counter(), threading.current_thread().name))
    clock.holding = holding
    _tf = candidates.tune_function
    def tune_function(*a, **k):
        MARK.append(("tune_function called", time.perf_counter()))
        t = _tf(*a, **k)
        MARK.append(("tune_function returned", time.perf_counter()))
        CAP.append(t)
        return t
    candidates.tune_function = tune_function

_wl = cli._workload
def workload(args):
    MARK.append(("workload start", time.perf_counter()))
    out = _wl(args)
    MARK.append(("workload made (tvm imported)", time.perf_counter()))
    install_hooks()
    return out
cli._workload = workload
rc = cli.main(sys.argv[1:] or ["tune", "matmul", "4096", "4096", "4096", "--dtype", "float16"])
MARK.append(("cli done", time.perf_counter()))
with open(os.environ.get("TIMELINE", "/dev/stderr"), "w") as f:
    for name, t in sorted(MARK, key=lambda m: m[1]):
        print(f"{t - T0:6.2f} {name}", file=f)
    for name, a, b, th in sorted(EV, key=lambda e: e[1]):
        if b - a > 0.05: print(f"   {a-T0:6.2f} {b-T0:6.2f} {b-a:5.2f} {name} [{th}]", file=f)
    for r in (CAP[0].results if CAP else []):
        ph = getattr(r.artifact, "phases", None) if r.artifact is not None else None
        if ph is not None:
            print("   build start %6.2f end %6.2f sched %5.2f compile %5.2f export %5.2f %s" % (
                ph.start_s - T0_EPOCH, ph.end_s - T0_EPOCH, ph.schedule_s, ph.compile_s, ph.export_s, r.config.kind), file=f)
sys.exit(rc)
