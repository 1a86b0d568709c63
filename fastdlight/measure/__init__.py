"""Timing and verification on the GPU: the library the search, the benchmarks and the export use.

* :mod:`.timing` – :class:`Workload` (inputs, rotation out of L2), ``time_module``,
  ``time_launches``, ``time_torch``; :mod:`.cuda_events` the CUDA events it times with.
* :mod:`.graph_timing` – the same inside CUDA graphs (kernels under ~50 us, whole models).
* :mod:`.clock` – where a tuning run's time went; :mod:`.host` host-side helpers.
* :mod:`.verify` – the per-element check against a float64 reference; :mod:`.widen` the
  float64 twin of a function that the reference runs.
"""
