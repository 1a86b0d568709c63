"""One GPU's worker of a tuning spread over several GPUs (:mod:`fastdlight.relax.devices`):

    CUDA_VISIBLE_DEVICES=1 python -m fastdlight.relax.device_worker TASK_DIR

``TASK_DIR`` holds the functions (``module.json``) and how to tune them (``task.json``). Each
function is tuned with the single-GPU path (:class:`ApplyFastTuning`); as one finishes, its
scheduled function goes to ``TASK_DIR/NAME.json`` and its report to stdout, one JSON line.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import threading

import tvm

from fastdlight.relax.apply_fast_tuning import ApplyFastTuning, FunctionReport
from fastdlight.relax.devices import MODULE, REPORT_PREFIX, TASK
from fastdlight.search.options import TuneOptions


def report_json(entry: FunctionReport, scheduled: bool) -> str:
    row = dataclasses.asdict(entry)
    row["config"] = entry.config.to_dict() if entry.config is not None else None
    row["scheduled"] = scheduled
    return REPORT_PREFIX + json.dumps(row, default=str)


def main(argv=None) -> int:
    (work,) = argv if argv is not None else sys.argv[1:]
    with open(os.path.join(work, MODULE)) as f:
        mod = tvm.ir.load_json(f.read())
    with open(os.path.join(work, TASK)) as f:
        task = json.load(f)
    lock = threading.Lock()

    def emit(entry: FunctionReport, scheduled) -> None:
        if scheduled is not None:
            tmp = os.path.join(work, f".{entry.function}.json")
            with open(tmp, "w") as f:
                f.write(tvm.ir.save_json(scheduled))
            os.replace(tmp, os.path.join(work, f"{entry.function}.json"))
        with lock:
            print(report_json(entry, scheduled is not None), flush=True)

    options = TuneOptions(**{**task["options"], "progress": False})
    tuning = ApplyFastTuning(topk=task["topk"], target=task["target"], meta_database_dir=task["database"],
                             options=options, progress=False, jobs=task["jobs"], opt_shapes=task["opt_shapes"],
                             parallel_build=options.parallel_build, on_function=emit)
    tuning(mod)
    return 0


if __name__ == "__main__":
    sys.exit(main())
