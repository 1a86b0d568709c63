"""A pool of worker processes that survive what a kernel candidate can do to them.

Compiling a candidate runs TVM lowering and nvcc; either can crash (segfault, abort), hang, or
raise. Each worker is a separate Python process (``python -m fastdlight.compiler.workers``, so the
caller's ``__main__`` is never re-imported, unlike multiprocessing's spawn). The parent talks
to it over a private pipe pair and enforces the timeout itself (``select`` with a deadline), so
even a hang that holds the worker's GIL is caught. A dead or timed-out worker is killed with
its whole process group (nvcc children included) and a fresh one is started for the next task.

Heavy imports (TVM) happen once per worker: ``initializer`` runs when a worker starts, outside
the tasks' timeouts.

Results are :class:`Outcome` objects carrying the caller's ``key``, so completion order never
matters.
"""

from __future__ import annotations

import os
import pickle
import queue
import select
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

_HEADER = struct.Struct("<Q")
#: Seconds a worker may take to start and run its initializer.
INIT_TIMEOUT = 600.0


@dataclass(frozen=True)
class Task:
    key: Any
    fn: Callable  # module-level function (pickled by reference)
    args: tuple = ()


@dataclass(frozen=True)
class Outcome:
    key: Any
    ok: bool
    value: Any = None  # fn's return value when ok
    error: str | None = None  # one line: why it failed
    log: str = ""  # the full story: traceback, worker stderr tail
    seconds: float = 0.0  # wall time of the task in the worker (incl. restart if any)


class WorkerError(RuntimeError):
    def __init__(self, error: str, log: str = ""):
        super().__init__(error)
        self.error, self.log = error, log


def _describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "worker died"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"worker crashed ({name})"
    return f"worker exited with code {returncode}"


class _Worker:
    """One child process and the parent's end of its pipes."""

    def __init__(self, slot: int, log_dir: str, initializer, initargs, env):
        self.slot = slot
        self.log_path = os.path.join(log_dir, f"worker{slot}.log")
        self.initializer, self.initargs, self.env = initializer, initargs, env
        self.proc: subprocess.Popen | None = None
        self.ready_at: float | None = None  # epoch seconds when the last start() finished setting up
        #: held while a thread starts / sets up / uses this worker (driver and warm-up threads)
        self.lock = threading.Lock()

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        self.log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "fastdlight.compiler.workers", str(to_child_r), str(from_child_w)],
                pass_fds=(to_child_r, from_child_w), stdin=subprocess.DEVNULL, stdout=self.log,
                stderr=self.log, env=self.env, start_new_session=True,  # own process group: killpg
            )  # fmt: skip
        finally:
            os.close(to_child_r)
            os.close(from_child_w)
        self.writer = os.fdopen(to_child_w, "wb")
        self.reader_fd = from_child_r
        if self.initializer is not None:
            self.call(self.initializer, self.initargs, INIT_TIMEOUT)
        self.ready_at = time.time()

    def kill(self) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self._reap()

    def request_exit(self) -> None:
        """EOF on the worker's pipe: it exits after its current task."""
        if self.proc is not None:
            try:
                self.writer.close()
            except OSError:
                pass

    def close(self, deadline: float | None = None) -> None:
        """Ask the worker to exit; kill it if it has not by ``deadline`` (monotonic)."""
        if self.proc is None:
            return
        self.request_exit()
        try:
            self.proc.wait(timeout=max(0.0, (deadline or time.monotonic() + 2.0) - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        self.kill()

    def _reap(self) -> None:
        proc, self.proc = self.proc, None
        try:
            proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            pass
        for f in (self.writer,):
            try:
                f.close()
            except OSError:
                pass
        try:
            os.close(self.reader_fd)
        except OSError:
            pass
        self.log.close()

    # -- one call -------------------------------------------------------------------------
    def _log_tail(self, offset: int, limit: int = 4000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                data = f.read()
        except OSError:
            return ""
        return data[-limit:].decode(errors="replace")

    def _read_exact(self, n: int, deadline: float | None) -> bytes | None:
        """n bytes from the worker, None on EOF; raises TimeoutError past the deadline."""
        chunks, got = [], 0
        while got < n:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self.reader_fd], [], [], wait)
            if not ready:
                raise TimeoutError
            chunk = os.read(self.reader_fd, min(n - got, 1 << 20))
            if not chunk:
                return None
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def call(self, fn, args, timeout: float | None):
        """Run fn(*args) in the worker. Returns its value; raises WorkerError on an exception in
        the task, a crash, or a timeout (the worker is then killed)."""
        if self.proc is None:
            self.start()
        offset = os.path.getsize(self.log_path) if os.path.exists(self.log_path) else 0
        data = pickle.dumps((fn, args), protocol=pickle.HIGHEST_PROTOCOL)
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            self.writer.write(_HEADER.pack(len(data)) + data)
            self.writer.flush()
            header = self._read_exact(_HEADER.size, deadline)
            payload = None if header is None else self._read_exact(_HEADER.unpack(header)[0], deadline)
        except TimeoutError:
            self.kill()
            raise WorkerError(f"timeout after {timeout:g} s (worker killed)", self._log_tail(offset)) from None
        except (BrokenPipeError, OSError):
            payload = None
        if payload is None:  # EOF: the worker died under us
            proc = self.proc
            try:
                proc.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                pass
            reason = _describe_exit(proc.poll())
            self.kill()
            raise WorkerError(reason, self._log_tail(offset))
        status, value, log = pickle.loads(payload)
        if status != "ok":
            raise WorkerError(value, log)
        return value


class WorkerPool:
    """``max_workers`` crash-proof worker processes; see the module docstring."""

    def __init__(self, max_workers: int | None = None, initializer=None, initargs=(),
                 log_dir: str | None = None):
        self.max_workers = max(1, max_workers or os.cpu_count() or 1)
        self._tmp = None
        if log_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="fastdlight_workers_")
            log_dir = self._tmp.name
        # The child must import exactly what the parent imports (fastdlight from a checkout,
        # test modules holding hook functions): hand it the parent's sys.path.
        env = dict(os.environ)
        paths = [os.path.abspath(p or os.getcwd()) for p in sys.path]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        self._workers = [_Worker(i, log_dir, initializer, initargs, env) for i in range(self.max_workers)]
        self._lock = threading.Lock()
        self._closed = False
        #: every call's tasks, in the order they came: ``(task, timeout, call)``, None to stop a server
        self._pending: queue.Queue = queue.Queue()
        self._servers: list[threading.Thread] = []

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran: the pool takes no more tasks."""
        return self._closed

    def reset(self) -> None:
        """Kill every worker now; each starts afresh with its next task (e.g. after a task may
        have left a worker in a bad state, like a CUDA context poisoned by a faulting kernel)."""
        for w in self._workers:
            with w.lock:
                w.kill()

    def ready_times(self) -> list[float]:
        """Epoch seconds at which each started worker became ready (diagnostics)."""
        return sorted(w.ready_at for w in self._workers if w.ready_at is not None)

    # -- running tasks --------------------------------------------------------------------
    @staticmethod
    def _setup(worker: _Worker) -> None:
        if worker.proc is None:
            worker.start()

    def _run_one(self, worker: _Worker, task: Task, timeout: float | None) -> Outcome:
        t0 = time.monotonic()
        with worker.lock:
            try:
                self._setup(worker)
                t_task = time.monotonic()
                value = worker.call(task.fn, task.args, timeout)
                return Outcome(task.key, True, value, seconds=time.monotonic() - t_task)
            except WorkerError as e:
                return Outcome(task.key, False, None, e.error, e.log, time.monotonic() - t0)
            except Exception as e:  # noqa: BLE001 - e.g. unpicklable task: record it, keep going
                return Outcome(task.key, False, None, f"{type(e).__name__}: {e}", traceback.format_exc(),
                               time.monotonic() - t0)

    def warm_up(self) -> None:
        """Start every worker in the background, so the first tasks do not wait for Python +
        TVM to import. Returns at once."""
        if self._closed:
            return

        def start(worker: _Worker):
            with worker.lock:
                try:
                    self._setup(worker)
                except Exception:  # noqa: BLE001 - the first real task will report it
                    pass

        for w in self._workers:
            threading.Thread(target=start, args=(w,), daemon=True).start()

    def imap_unordered(self, tasks: Iterable[Task], timeout: float | None = None,
                       post: Callable[[Outcome], Outcome] | None = None) -> Iterator[Outcome]:
        """Run tasks on the workers; yield one :class:`Outcome` per task as each finishes.
        ``post`` (if given) runs on each outcome in the pool's thread before it is yielded, so
        follow-up work overlaps what the caller does with earlier outcomes. Calls made at once
        (several functions tuned at a time) share the workers through one queue, first come first
        served: a free worker takes the next task of any call, and no call's task waits for one
        worker while another is idle."""
        if self._closed:
            raise RuntimeError("WorkerPool is closed")
        tasks = list(tasks)
        call = _Call(queue.Queue())
        done: queue.Queue = call.raw if post is None else queue.Queue()
        post_thread = None
        if post is not None:  # a thread of its own: a worker's next task must not wait for it
            post_thread = threading.Thread(target=_apply_post, args=(call.raw, done, post, len(tasks)), daemon=True)
            post_thread.start()
        self._start_servers()
        for t in tasks:
            self._pending.put((t, timeout, call))
        given = 0
        try:
            for given in range(1, len(tasks) + 1):
                out = done.get()
                if out is _CLOSED:
                    raise RuntimeError("WorkerPool is closed")
                yield out
        except GeneratorExit:
            # The caller stopped early: start nothing new of this call, let its running tasks
            # finish (they may write where the caller is about to clean up)
            call.cancelled = True
            if post_thread is not None:
                post_thread.join()
            else:
                for _ in range(len(tasks) - given):
                    call.raw.get()
            raise
        except BaseException:
            # Interrupted (Ctrl-C): stop the workers so the serving threads unblock.
            call.cancelled = True
            self.close()
            raise

    def _start_servers(self) -> None:
        """A thread per worker that serves the queue (started once, with the first call)."""
        with self._lock:
            if self._servers:
                return
            self._servers = [threading.Thread(target=self._serve, args=(w,), daemon=True,
                                              name=f"fastdlight-worker-{w.slot}") for w in self._workers]
            for th in self._servers:
                th.start()

    def _serve(self, worker: _Worker) -> None:
        while True:
            item = self._pending.get()
            if item is None:
                return
            task, timeout, call = item
            if call.cancelled:
                call.raw.put(_SKIPPED)
            elif self._closed:
                call.raw.put(_CLOSED)
            else:
                call.raw.put(self._run_one(worker, task, timeout))

    def close(self, grace: float = 2.0) -> None:
        """Stop the workers: each may exit on its own for ``grace`` seconds, then is killed
        (``grace=0``: killed at once, e.g. at interpreter exit, where waiting for every
        worker's TVM teardown would only delay the caller)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for _ in self._servers:  # each serving thread ends after its current task
            self._pending.put(None)
        for w in self._workers:  # all at once: TVM teardown takes a moment per process
            w.request_exit()
        deadline = time.monotonic() + grace
        for w in self._workers:
            w.close(deadline)
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


@dataclass
class _Call:
    """One :meth:`WorkerPool.imap_unordered` call: where its outcomes go, whether it stopped."""

    raw: queue.Queue
    cancelled: bool = False


#: what a serving thread puts for a task it skipped: its call stopped early, or the pool closed
_SKIPPED, _CLOSED = object(), object()


def _apply_post(raw: queue.Queue, done: queue.Queue, post: Callable[[Outcome], Outcome], n: int) -> None:
    """``post`` on each of a call's ``n`` outcomes, as they come; skipped tasks only counted."""
    for _ in range(n):
        out = raw.get()
        if out is _SKIPPED:
            continue
        if out is not _CLOSED:
            try:
                out = post(out)
            except Exception as e:  # noqa: BLE001 - the outcome must still arrive
                out = Outcome(out.key, False, None, f"{type(e).__name__}: {e}", traceback.format_exc(), out.seconds)
        done.put(out)


# -- the child side -----------------------------------------------------------------------
def one_line(e: BaseException) -> str:
    """An exception as one line: its own ``one_line`` if it has one, else "Type: first line"."""
    if getattr(e, "one_line", None):
        return e.one_line
    first = str(e).strip().splitlines()
    return f"{type(e).__name__}: {first[0]}" if first else type(e).__name__


def _child_main(read_fd: int, write_fd: int) -> None:
    reader = os.fdopen(read_fd, "rb")
    writer = os.fdopen(write_fd, "wb")
    while True:
        header = reader.read(_HEADER.size)
        if len(header) < _HEADER.size:
            return  # parent closed the pipe: exit quietly
        data = reader.read(_HEADER.unpack(header)[0])
        try:
            fn, args = pickle.loads(data)
            reply = ("ok", fn(*args), "")
        except BaseException as e:  # noqa: BLE001 - report everything, keep serving
            reply = ("error", one_line(e), "\n".join(filter(None, [getattr(e, "log", ""), traceback.format_exc()])))
        try:
            payload = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:  # noqa: BLE001 - unpicklable return value
            payload = pickle.dumps(("error", f"result not picklable: {e}", traceback.format_exc()))
        writer.write(_HEADER.pack(len(payload)) + payload)
        writer.flush()


def _block_torch() -> None:
    """tvm_ffi imports torch whenever it is installed (4-5 s per process on the H100 machine,
    more than TVM itself); build workers never use it. ``import torch`` now raises ImportError,
    which tvm_ffi tolerates. FASTDLIGHT_WORKER_TORCH=1 keeps torch importable (a custom
    template that needs it)."""
    if os.environ.get("FASTDLIGHT_WORKER_TORCH") != "1":
        sys.modules.setdefault("torch", None)


if __name__ == "__main__":
    _block_torch()
    _child_main(int(sys.argv[1]), int(sys.argv[2]))
