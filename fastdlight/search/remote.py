"""Candidates timed and verified on another machine's GPU, through TVM's RPC.

The candidates are built here (the build workers, as for a local run); their libraries go to a
``python -m fastdlight.rpc_server`` by ``RPCSession.upload``, and one remote call,
``fastdlight.rpc.measure``, runs our own measurement there: random inputs made on that GPU, the
first timing, the finalists' hot turns, the float64 reference (its library travels too) and the
element-wise checks. What comes back is each candidate's timing and verdict (or failure), as
JSON; the winner is picked here from those. The server is reached directly (``HOST:PORT``) or
through a TVM tracker (``HOST:PORT:KEY``, ``python -m tvm.exec.rpc_tracker``), as MetaSchedule's
runner reaches it.

A server that dies or cannot be reached in the middle of a function's measurement costs only
that attempt: the function is measured again on the next server the tracker gives (or the same
address), up to :data:`ATTEMPTS` times, and then fails with one line that says why.
"""

from __future__ import annotations

import dataclasses
import json
import os
import warnings
from dataclasses import dataclass

from tvm import rpc

from fastdlight.measure.timing import Timing
from fastdlight.measure.verify import Verdict
from fastdlight.search.options import RpcSpec
from fastdlight.search.results import CompileResult, Failure

#: the remote function our RPC server registers
MEASURE_FUNC = "fastdlight.rpc.measure"
#: tries of one function's measurement, each on a fresh connection (another server if a tracker has one)
ATTEMPTS = 3
#: seconds a remote connection may last before the server ends it (0: no limit)
CONNECTION_TIMEOUT = 0


class RemoteError(RuntimeError):
    """The remote measurement could not be done (the message is one line)."""


class RemoteFailure(Exception):
    """The server measured and its measurement failed (no retry)."""


def connect(spec: RpcSpec):
    """A new RPC connection to a server: ``spec``'s own, or one its tracker has under its key."""
    if spec.key:
        return rpc.connect_tracker(spec.host, spec.port).request(spec.key, session_timeout=CONNECTION_TIMEOUT, max_retry=1)
    return rpc.connect(spec.host, spec.port, session_timeout=CONNECTION_TIMEOUT)


@dataclass(frozen=True)
class RemoteOutcome:
    """What a server measured: ``results`` (index -> its timing, verdict or failure, as JSON
    fields), the device's name and the byte count of the function's buffers; or ``error``,
    one line, when it measured nothing (a server without a GPU)."""

    results: dict
    best: int | None = None
    device: str = ""
    nbytes: int = 0
    error: str = ""


def request_json(func_json: str, configs, artifacts: dict, reference: str | None, options: dict) -> str:
    """The measurement request: the function, the configs, the uploaded library of each
    candidate (by index) and of the reference, the measurement options."""
    return json.dumps({"func": func_json, "configs": [c.to_dict() for c in configs],
                       "artifacts": {str(k): v for k, v in artifacts.items()}, "reference": reference,
                       "options": options})


def result_fields(r: CompileResult) -> dict:
    """What the client needs of a remotely measured candidate (JSON-able)."""
    return {"timing": dataclasses.asdict(r.timing) if r.timing is not None else None,
            "verdict": dataclasses.asdict(r.verdict) if r.verdict is not None else None,
            "failure": dataclasses.asdict(r.failure) if r.failure is not None else None}


def merged(local: CompileResult, fields: dict) -> CompileResult:
    """``local`` (built here) with the timing, verdict and failure the server measured."""
    timing = fields.get("timing")
    if timing is not None:
        timing = Timing(timing["median_ms"], tuple(timing["samples_ms"]), timing["hot"], timing["graph"])
    verdict = Verdict(**fields["verdict"]) if fields.get("verdict") else None
    failure = Failure(**fields["failure"]) if fields.get("failure") else local.failure
    return local.replace(timing=timing, verdict=verdict, failure=failure)


def measure_remotely(spec: RpcSpec, func_json: str, configs, builts, reference_path: str | None,
                     options: dict) -> RemoteOutcome:
    """Upload the built libraries, run :data:`MEASURE_FUNC` on a server, parse its answer;
    retried on a fresh connection when the server dies or cannot be reached."""
    last = ""
    for _attempt in range(ATTEMPTS):
        try:
            conn = connect(spec)
            artifacts = {b.key: _upload(conn, b.artifact.so_path) for b in builts
                         if b.artifact is not None and b.failure is None and b.artifact.so_path}
            reference = _upload(conn, reference_path) if reference_path else None
            answer = conn.get_function(MEASURE_FUNC)(request_json(func_json, configs, artifacts, reference, options))
            data = json.loads(answer)
            if data.get("failed"):
                raise RemoteFailure(data["failed"])
            return RemoteOutcome({int(k): v for k, v in data.get("results", {}).items()}, data.get("best"),
                                 data.get("device", ""), int(data.get("nbytes", 0)), data.get("error", ""))
        except RemoteFailure as e:  # it measured, and that failed: the same again would too
            raise RemoteError(f"the RPC server at {spec} could not use the candidates: {e}") from None
        except Exception as e:  # noqa: BLE001 - a dead or unreachable server: try another connection
            last = " ".join(str(e).split())[:300] or type(e).__name__
            if _attempt + 1 < ATTEMPTS:
                warnings.warn(f"fastdlight: the RPC server at {spec} did not measure (try {_attempt + 1} of "
                              f"{ATTEMPTS}): {last}; trying again", stacklevel=2)
    raise RemoteError(f"the RPC server at {spec} did not measure ({ATTEMPTS} tries): {last}")


def _upload(conn, path: str) -> str:
    """``path`` uploaded into the server's work directory; the name it has there."""
    name = f"fastdlight_{os.getpid()}_{abs(hash(path))}_{os.path.basename(path)}"
    conn.upload(path, target=name)
    return name
