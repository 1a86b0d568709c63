"""From a scheduled function to a cubin and a loadable module, in parallel.

* :mod:`.artifacts` – :class:`BuildRequest` in, :class:`BuildArtifact` out (pickled to workers).
* :mod:`.build_task` – one candidate's schedule, lower, compile and export, inside a worker.
* :mod:`.compile` – the TIR pipelines and the CUDA compile (nvcc, or NVRTC via :mod:`.nvrtc`).
* :mod:`.workers`, :mod:`.pool` – the build worker processes and the shared pool.
"""
