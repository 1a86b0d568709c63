"""fastdlight's verified winners as a MetaSchedule JSON database, for TVM's own tools.

    ms.database.JSONDatabase(work_dir="tuned/")                 # what TVM opens
    with database, target:
        mod = relax.transform.MetaScheduleApplyDatabase()(mod)  # applies the same schedules

:class:`~fastdlight.search.database.TuningDatabase` (``fastdlight_records.jsonl``) stays the source
of truth; every verified record it stores is also appended here, beside it
(``database_workload.json``, ``database_tuning_record.json``), as the workload (the function,
normalized as MetaSchedule does) and the schedule's trace, with the measured median as
``run_secs``. The other way, :meth:`MetaScheduleView.records` reads a MetaSchedule database of
the same layout (one ``ms.tune_tir`` wrote, for example) and turns a function's best records into
``ms_record`` configs, which the tuner measures beside its own candidates. Kernels without a trace (the Hopper wgmma template writes a TIRx kernel, not an
``s_tir`` schedule) are not in the view. A build of what MetaSchedule applies needs what
``fastdlight.build`` sets up: the pass-context options of ``fastdlight.compiler.compile.PASS_CONFIG``
(cp.async, no TIR CSE) and, for tensor-core schedules, the intrinsics of
``tvm.s_tir.tensor_intrin.cuda`` plus the three ``fastdlight.schedules.matmul_tensorcore``
registers (``register_intrinsics``).

The view is a mirror: a view file that cannot be read or written (garbage in it, a directory in
its place) is a warning, once per view, and never undoes or hides a record of the JSON-lines file.
"""

from __future__ import annotations

import os
import threading
import warnings

import tvm
from tvm import s_tir
from tvm.s_tir import meta_schedule as ms

from fastdlight.compiler.build_task import apply_template
from fastdlight.compiler.workers import one_line
from fastdlight.config import MetaScheduleRecord
from fastdlight.schedules.ms_record import trace_text

WORKLOAD_FILE = "database_workload.json"
RECORD_FILE = "database_tuning_record.json"
#: one lock for every view in the process: TVM's JSONDatabase is not safe to construct or
#: commit from two threads at once even through two objects (reading the files while another
#: object appends to them crashed the interpreter, a segfault, in a test of four writers)
_MS_LOCK = threading.Lock()


class MetaScheduleView:
    def __init__(self, directory):
        self.dir = os.fspath(directory)
        self._db = None
        self._lock = _MS_LOCK
        self._warned = False

    @property
    def paths(self) -> tuple[str, str]:
        return os.path.join(self.dir, WORKLOAD_FILE), os.path.join(self.dir, RECORD_FILE)

    def add(self, func, arch, config, latency_ms: float | None) -> bool:
        """Append ``config``'s schedule of ``func`` for ``arch``. False (nothing written) when the
        schedule has no trace, the config no longer applies or the view's files are unusable
        (then with a warning: the caller's record is already stored and stands)."""
        try:
            with arch.target:
                sch = apply_template(func, config)
        except Exception:  # noqa: BLE001 - the JSON-lines record stands; the view just lacks it
            return False
        if not isinstance(sch, s_tir.Schedule) or sch.trace is None:
            return False
        normalize = tvm.get_global_func("tvm.s_tir.meta_schedule.normalize_mod")
        run_secs = [latency_ms / 1e3] if latency_ms is not None else None
        with self._lock:
            try:
                if self._db is None:
                    self._db = ms.database.JSONDatabase(*self.paths)
                workload = self._db.commit_workload(normalize(func))
                self._db.commit_tuning_record(ms.database.TuningRecord(
                    sch.trace, workload, run_secs, arch.target, ms.arg_info.ArgInfo.from_prim_func(func)))
            except Exception as e:  # noqa: BLE001 - TVM's JSON database raises TVMError, OSError, ...
                self._db = None  # read afresh next time, in case the files were mended
                self._warn(f"not updated ({one_line(e)}); the record is stored in fastdlight's records")
                return False
        return True

    def records(self, func, limit: int = 4) -> tuple:
        """The best ``limit`` records MetaSchedule's database here holds for ``func`` (fastest
        first), as :class:`~fastdlight.config.MetaScheduleRecord`; none when there is no database,
        no record of the function, or the database cannot be read (then with a warning)."""
        if not all(os.path.isfile(p) for p in self.paths):
            return ()
        normalize = tvm.get_global_func("tvm.s_tir.meta_schedule.normalize_mod")
        mod = normalize(func)
        with self._lock:
            try:
                db = self._db or ms.database.JSONDatabase(*self.paths)
                if not db.has_workload(mod):
                    return ()
                top = db.get_top_k(db.commit_workload(mod), limit)
            except Exception as e:  # noqa: BLE001 - an unreadable database has no records to offer
                self._warn(f"not read ({one_line(e)})")
                return ()
        configs = []
        for rec in top:
            text = trace_text(rec.trace)
            if all(c.trace != text for c in configs):
                configs.append(MetaScheduleRecord(text))
        return tuple(configs)

    def _warn(self, what: str) -> None:
        """One warning per view: a broken file fails every commit of a run the same way."""
        if not self._warned:
            self._warned = True
            warnings.warn(f"fastdlight: the MetaSchedule database {self.paths[0]} (and {RECORD_FILE}) was {what}",
                          stacklevel=4)
