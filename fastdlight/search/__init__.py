"""The search: which candidates to build, how to time and pick them, and what to keep.

* :mod:`.runner` – ``apply_and_build``: build, time and verify a list of configs, pick the winner;
  :mod:`.stages` its phases, :mod:`.reference` the float64 reference run.
* :mod:`.candidates` – ``tune_function``, the one candidate path that ``fastdlight.tune``, the CLI
  and ``ApplyFastTuning`` share (policy sets from :mod:`fastdlight.policies.select`, stock
  Dlight, database replay).
* :mod:`.tuner` – ``tune`` and ``tune_dispatch``; :mod:`.dynamic` symbolic shapes behind a dispatcher.
* :mod:`.results`, :mod:`.options`, :mod:`.report` – the result rows, the one options object, tables.
* :mod:`.database`, :mod:`.meta_schedule_view` – the records and their MetaSchedule mirror.
* :mod:`.autotune` – ``@fastdlight.autotune`` over a user's own schedule space.

Submodules are imported on use: build workers import only what they need.
"""
