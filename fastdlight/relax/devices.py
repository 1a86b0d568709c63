"""Tuning a module's functions on several GPUs of this machine: one worker process per GPU.

    ApplyFastTuning(devices=(0, 1), meta_database_dir="tuned/")(mod)

Each worker (``python -m fastdlight.relax.device_worker``) sees one GPU (``CUDA_VISIBLE_DEVICES``)
and tunes its share of the functions with the single-GPU path, unchanged: its own build pool (a
process per CPU: the OS shares them where several workers build at once), its own timing and
checks. A function's candidates are all timed on
one GPU, so GPUs that differ slightly never decide between two candidates. The share is decided
before the workers start (:func:`shares`): families of functions (a matmul and the siblings seeded
from it) go whole to one worker, heaviest first, each to the worker with the least estimated work.

A worker sends each function's report as a JSON line when it is done and writes its scheduled
function to the task directory; the database (if any) is shared, its appends atomic. A worker that
dies, or finishes nothing for :data:`WORKER_SILENCE_S` (then it is stopped), loses only its
unfinished functions: they go to the workers that finished (once), and what
is still left then is tuned in the pass's own process, on its GPU 0; each such function's report
says what happened (``requeued``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import tvm
from tvm import tirx

from fastdlight.analysis.matmul_match import anchor_key
from fastdlight.search.options import TuneOptions

#: the worker's module (``python -m``)
WORKER = "fastdlight.relax.device_worker"
#: seconds a worker may go without finishing a function before it counts as hung and is stopped
#: (a candidate's build has its own timeout, a kernel's first run the probe's: this is the last
#: resort, well above a slow function's tuning)
WORKER_SILENCE_S = 900.0
#: what a worker's task directory holds
MODULE, TASK = "module.json", "task.json"
#: a line a worker prints for each function it finished (then a JSON report)
REPORT_PREFIX = "fastdlight-report "
#: TuneOptions fields that are hooks or live objects: a run that sets one stays in one process
LOCAL_ONLY = ("ref", "workload", "template", "hook", "pool", "rpc")


def spreads(options: TuneOptions) -> bool:
    """Whether a run with ``options`` tunes in worker processes: on several GPUs, or on one that
    is not this process's GPU 0. A run with a hook or live object (:data:`LOCAL_ONLY`) cannot."""
    return (options.devices is not None and options.devices != (0,)
            and all(getattr(options, name) is None for name in LOCAL_ONLY))


def weight(func: tirx.PrimFunc, topk: int, options: TuneOptions) -> int:
    """Estimated work of tuning ``func``: the candidates it will build."""
    return topk if anchor_key(func) is not None else min(options.memory_bound_topk or topk, topk)


def shares(families: list[list[int]], weights: list[int], n: int) -> list[list[int]]:
    """``families`` (lists of group indices) dealt to ``n`` workers: heaviest family first, each to
    the worker with the least work so far (longest-processing-time first)."""
    load, out = [0] * n, [[] for _ in range(n)]
    for fam in sorted(families, key=lambda f: -sum(weights[i] for i in f)):
        w = min(range(n), key=lambda k: (load[k], k))
        out[w].extend(fam)
        load[w] += sum(weights[i] for i in fam)
    return [sorted(s) for s in out]


def options_json(options: TuneOptions) -> dict:
    """The JSON-able fields of ``options`` a worker runs with. Each worker's build pool has a
    process per CPU (unless ``max_workers`` says otherwise), not its share of them: the shares of
    work are uneven and end at different times, and where both workers build at once the OS
    shares the CPUs. With half the CPUs each, two H200s tuned ResNet-18 at 0.94x and a LLaMA
    layer at 0.54x the candidates per second of one (2026-11-29)."""
    skip = set(LOCAL_ONLY) | {"devices"}
    return {f: getattr(options, f) for f in options.__dataclass_fields__ if f not in skip}


@dataclass
class Spread:
    """What the workers gave: by function name, (scheduled function or None, report dict);
    ``lost``: the names of functions a worker did not finish, and why; ``failed``: the GPUs
    whose worker left some unfinished."""

    done: dict = field(default_factory=dict)
    lost: dict = field(default_factory=dict)
    failed: set = field(default_factory=set)


def tune_spread(named: list[tuple[str, tirx.PrimFunc]], families: list[list[int]], weights: list[int], devices,
                task: dict, on_done: Callable[[str], None] | None = None) -> Spread:
    """``named`` (function name, function) tuned by one worker per GPU of ``devices``, the
    ``families`` (indices into ``named``) dealt by :func:`shares`. The functions of a worker
    that failed go to the workers that finished, once; what is still lost then is the caller's."""
    dealt = shares(families, weights, len(devices))
    spread = run_workers([[named[i] for i in share] for share in dealt], devices, task, on_done)
    survivors = [d for d in devices if d not in spread.failed]
    if not spread.lost or not survivors:
        return spread
    lost = [i for i, (name, _) in enumerate(named) if name in spread.lost]
    again = run_workers([[named[i] for i in share] for share in shares([[i] for i in lost], weights, len(survivors))],
                        survivors, task, on_done)
    for name, (scheduled, row) in again.done.items():
        row["requeued"] = spread.lost.pop(name)
        spread.done[name] = (scheduled, row)
    spread.lost.update({name: f"{spread.lost[name]}; then {why}" for name, why in again.lost.items()})
    return spread


def _watch(proc: subprocess.Popen, heard: list[float], silenced: list[bool]) -> None:
    """Kill ``proc`` once it has said nothing for :data:`WORKER_SILENCE_S` seconds."""
    while proc.poll() is None:
        if time.monotonic() - heard[0] > WORKER_SILENCE_S:
            silenced.append(True)
            proc.kill()
            return
        time.sleep(min(1.0, WORKER_SILENCE_S / 10))


def run_workers(named_funcs: list[list[tuple[str, tirx.PrimFunc]]], devices, task: dict,
                on_done: Callable[[str], None] | None = None) -> Spread:
    """Start one worker per share (``named_funcs[k]`` on ``devices[k]``), wait for all, collect."""
    spread, lock = Spread(), threading.Lock()
    with tempfile.TemporaryDirectory(prefix="fastdlight_devices_") as root:
        threads = []
        for k, (share, device) in enumerate(zip(named_funcs, devices)):
            if not share:
                continue
            work = os.path.join(root, f"gpu{device}")
            os.makedirs(work)
            with open(os.path.join(work, MODULE), "w") as f:
                f.write(tvm.ir.save_json(tvm.IRModule({name: func for name, func in share})))
            with open(os.path.join(work, TASK), "w") as f:
                json.dump({**task, "names": [name for name, _ in share]}, f)
            t = threading.Thread(target=_run_one, args=(work, device, [n for n, _ in share], spread, lock, on_done),
                                 daemon=True, name=f"fastdlight-gpu{device}")
            t.start()
            threads.append(t)
        for t in threads:
            t.join()
    return spread


def _run_one(work: str, device: int, names: list[str], spread: Spread, lock: threading.Lock, on_done) -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(device)}
    cmd = [sys.executable, "-m", WORKER, work]
    finished = set()
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        err = []
        reader = threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)
        reader.start()
        heard, silenced = [time.monotonic()], []
        threading.Thread(target=_watch, args=(proc, heard, silenced), daemon=True).start()
        for line in proc.stdout:
            heard[0] = time.monotonic()
            if not line.startswith(REPORT_PREFIX):
                continue
            try:  # a worker killed mid-line leaves that function to the others
                row = json.loads(line[len(REPORT_PREFIX):])
                scheduled = None
                if row.pop("scheduled", None):
                    with open(os.path.join(work, f"{row['function']}.json")) as f:
                        scheduled = tvm.ir.load_json(f.read())
            except Exception:  # noqa: BLE001 - a torn line or file: not finished
                continue
            row["device"] = device
            with lock:
                spread.done[row["function"]] = (scheduled, row)
            finished.add(row["function"])
            if on_done is not None:
                on_done(row["function"])
        rc = proc.wait()
        reader.join(timeout=5)
    missing = [n for n in names if n not in finished]
    if missing:
        why = f"the worker on GPU {device} " + (
            f"finished nothing for {WORKER_SILENCE_S:g} s and was stopped" if silenced
            else f"exited with {rc}" if rc > 0 else f"died of signal {-rc}" if rc < 0 else "ended early")
        tail = next((line.strip() for line in reversed(err) if line.strip()), "")
        with lock:
            spread.failed.add(device)
            for n in missing:
                spread.lost[n] = why + (f" ({tail[:200]})" if tail else "")
