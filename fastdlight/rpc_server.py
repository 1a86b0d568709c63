"""A GPU machine's RPC server for fastdlight: candidates built elsewhere are timed and verified
here, on this machine's GPU, with fastdlight's own measurement.

    python -m fastdlight.rpc_server [--host 0.0.0.0] [--port 9090] [--tracker HOST:PORT --key KEY]

It is TVM's RPC server (``tvm.rpc.Server``: uploads go to its work directory) with one more
remote function, ``fastdlight.rpc.measure`` (:data:`fastdlight.search.remote.MEASURE_FUNC`):
given a function, its configs and the uploaded library of each candidate and of the float64
reference, it makes the inputs on this GPU, times, retimes and verifies the candidates as a local
run does (:func:`fastdlight.search.runner.measure_built`) and answers with each one's timing and
verdict. The measuring runs in one process the server starts (see :func:`measure`). With
``--tracker`` it registers with a TVM tracker under ``--key``; tuners then ask the tracker for it
(``--rpc HOST:PORT:KEY``). A machine without a GPU answers that it has none
(tuners then rank by the policy's estimate): a compile-only setup still checks the whole path.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import subprocess
import sys
import time

import tvm
from tvm.rpc.server import PopenRPCServerState

from fastdlight.arch import CUDA, has_gpu
from fastdlight.compiler.artifacts import BuildArtifact
from fastdlight.config import config_from_dict
from fastdlight.search.remote import MEASURE_FUNC, result_fields
from fastdlight.search.runner import REF_KEY, BuildPlan, measure_built
from fastdlight.search.options import RpcSpec, TuneOptions
from fastdlight.search.stages import Built


#: the measuring process this server started (its pipes are inherited by the connections' forked
#: children; TVM serves one connection at a time, so one child at a time writes to it)
_MEASURER: subprocess.Popen | None = None
#: what the measuring process puts before each answer (anything else it prints is not one)
ANSWER_PREFIX = "fastdlight-answer "


def measure(request: str) -> str:
    """:data:`MEASURE_FUNC`: a JSON request (``fastdlight.search.remote.request_json``) in, the
    JSON answer out (``results`` by index, ``best``, ``device``, ``nbytes``; or ``error`` where
    nothing could be timed, ``failed`` where the measurement itself failed).

    It runs in the child TVM forks for each connection, and measures in another process
    (:func:`measure_here`): CUDA cannot be initialized in a forked child of a process that loaded
    it (on an H200 every measurement failed with ``cudaErrorInitializationError``). That process is
    the server's own long-lived one (``--measure-loop``: one TVM import and one CUDA context for
    all requests); where it is gone (a kernel that faulted took it down), a process of its own for
    this request (``--measure``, a TVM import each)."""
    workpath = tvm.get_global_func("tvm.rpc.server.workpath")
    req = json.loads(request)
    req["artifacts"] = {key: workpath(name) for key, name in req["artifacts"].items()}
    if req.get("reference"):
        req["reference"] = workpath(req["reference"])
    answer = _ask_measurer(req)
    if answer is not None:
        return answer
    path = workpath(f"request_{os.getpid()}_{time.monotonic_ns()}.json")
    with open(path, "w") as f:
        json.dump(req, f)
    done = subprocess.run([sys.executable, "-m", "fastdlight.rpc_server", "--measure", path],
                          capture_output=True, text=True, check=False)
    answer = next((line[len(ANSWER_PREFIX):] for line in reversed(done.stdout.splitlines())
                   if line.startswith(ANSWER_PREFIX)), None)
    if done.returncode != 0 or answer is None:
        tail = next((line.strip() for line in reversed(done.stderr.splitlines()) if line.strip()), "")
        why = f"exited with {done.returncode}" if done.returncode > 0 else f"died of signal {-done.returncode}"
        return json.dumps({"failed": f"the measuring process {why}: {tail[:400]}"})
    return answer


def _ask_measurer(req: dict) -> str | None:
    """The long-lived measuring process's answer to ``req``, or None where there is none (never
    started, or it died: then the next request does not try it again either)."""
    proc = _MEASURER
    if proc is None or proc.poll() is not None:
        return None
    # an answer to an earlier request whose connection ended before reading it is skipped
    ticket = f"{os.getpid()}-{time.monotonic_ns()}"
    try:
        proc.stdin.write(json.dumps({**req, "ticket": ticket}) + "\n")
        proc.stdin.flush()
        for line in proc.stdout:
            if line.startswith(f"{ANSWER_PREFIX}{ticket} "):
                return line[len(ANSWER_PREFIX) + len(ticket) + 1:].strip()
    except (OSError, ValueError):  # a broken pipe: it died
        pass
    return None


def _measure_loop() -> int:
    """``--measure-loop``: one request a line on stdin, one answer a line on stdout (after the
    prefix and the request's ticket)."""
    for line in sys.stdin:
        if line.strip():
            req = json.loads(line)
            print(f"{ANSWER_PREFIX}{req.pop('ticket', '')} " + json.dumps(measure_here(req)), flush=True)
    return 0


def measure_here(req: dict) -> dict:
    """The measurement of :func:`measure`'s request (libraries by path), in this process."""
    if not has_gpu():
        received = len(req["artifacts"]) + (1 if req.get("reference") else 0)
        return {"error": f"the RPC server on {socket.gethostname()} has no GPU (it received {received} libraries)",
                "received": received}
    func = tvm.ir.load_json(req["func"])
    configs = tuple(config_from_dict(c) for c in req["configs"])
    arch = CUDA.from_device(tvm.cuda(0))
    plan = BuildPlan(func, req["func"], configs, arch, True, ())
    builts = [Built(int(key), _artifact(int(key), path), None, 0.0) for key, path in req["artifacts"].items()]
    if req.get("reference"):
        builts.insert(0, Built(REF_KEY, _artifact(REF_KEY, req["reference"]), None, 0.0))
    opts = TuneOptions(probe=False, **req["options"])
    log = logging.getLogger("fastdlight.rpc_server")
    log.info("measuring %d libraries on %s", len(builts), arch.device_name or arch.name)
    try:
        ranked, best, nbytes = measure_built(plan, builts, opts)
    except Exception as e:  # noqa: BLE001 - the tuner is told why, in one line, and does not retry
        log.exception("the measurement failed")
        return {"failed": " ".join(str(e).split())[:500] or type(e).__name__}
    log.info("measured: the fastest is candidate %s", best.index if best is not None else None)
    return {"results": {str(r.index): result_fields(r) for r in ranked},
            "best": best.index if best is not None else None,
            "device": arch.device_name or arch.name, "nbytes": nbytes}


def _artifact(key, so_path: str) -> BuildArtifact:
    """An uploaded library as the measurement loads it (its source and ptxas numbers stay with
    the tuner that built it)."""
    return BuildArtifact(key, source="", registers=0, spill_bytes=0, shared_bytes=0, cubin=b"", so_path=so_path)


def register() -> None:
    """Adds :data:`MEASURE_FUNC` to this process (before it serves)."""
    tvm.register_global_func(MEASURE_FUNC, measure, override=True)


def gpu_line() -> str:
    """Whether the connections will find a GPU, asked in a process of its own: each connection
    is served by a child forked from this process, and CUDA is unusable in the forked child of a
    process that had initialized it (with ``has_gpu`` called here, a tune through a server on an
    H200 waited two minutes for an answer that never came)."""
    probe = "from fastdlight.arch import has_gpu; print(has_gpu())"
    try:
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown (the check did not finish)"
    return "yes" if done.stdout.strip() == "True" else "none (compile-only)"


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="python -m fastdlight.rpc_server", description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="0.0.0.0", help="address to listen on")
    ap.add_argument("--port", type=int, default=9090, help="first port to try (up to 100 more)")
    ap.add_argument("--tracker", help="HOST:PORT of a TVM tracker to register with")
    ap.add_argument("--key", default="", help="the key to register under (with --tracker)")
    ap.add_argument("--verbose", action="store_true", help="log each connection (TVM's RPC server log) to stderr")
    ap.add_argument("--measure", metavar="REQUEST", help=argparse.SUPPRESS)  # one measurement (the server runs it)
    ap.add_argument("--measure-loop", action="store_true", help=argparse.SUPPRESS)  # the server's measuring process
    args = ap.parse_args(argv)
    if args.tracker:
        try:
            spec = RpcSpec.parse(args.tracker)
        except ValueError:
            ap.error(f"--tracker {args.tracker!r}: expected HOST:PORT")
        if not args.key:
            ap.error("--tracker needs --key (the key tuners ask the tracker for)")
        args.tracker = (spec.host, spec.port)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.verbose:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if args.measure:
        with open(args.measure) as f:
            print(ANSWER_PREFIX + json.dumps(measure_here(json.load(f))), flush=True)
        return 0
    if args.measure_loop:
        return _measure_loop()
    global _MEASURER
    _MEASURER = subprocess.Popen([sys.executable, "-m", "fastdlight.rpc_server", "--measure-loop"]
                                 + (["--verbose"] if args.verbose else []),
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    register()
    # TVM's listening loop in this process (rpc.Server would start it in a worker process through
    # cloudpickle, which TVM does not depend on); each connection is served by a forked child, which has
    # the function registered above
    server = PopenRPCServerState(args.host, args.port, args.port + 100, tracker_addr=args.tracker, key=args.key,
                                 silent=not args.verbose)
    print(f"fastdlight RPC server on {args.host}:{server.port}"
          + (f", registered with the tracker {args.tracker[0]}:{args.tracker[1]} as {args.key!r}" if args.tracker
             else "") + f"; GPU: {gpu_line()}", flush=True)
    try:
        server.thread.join()
    except KeyboardInterrupt:
        pass
    finally:
        _MEASURER.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
