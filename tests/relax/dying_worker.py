"""A device worker that dies at once on the GPUs ``DYING_GPUS`` names (``CUDA_VISIBLE_DEVICES``
one of them), or hangs on those ``HANGING_GPUS`` names: what a crashed or hung worker leaves the
pass. On other GPUs it is the real worker."""

import os
import sys
import time

from fastdlight.relax import device_worker

if __name__ == "__main__":
    if os.environ.get("CUDA_VISIBLE_DEVICES") in os.environ.get("DYING_GPUS", "").split(","):
        print(f"worker on GPU {os.environ['CUDA_VISIBLE_DEVICES']}: simulated crash", file=sys.stderr, flush=True)
        os._exit(3)
    if os.environ.get("CUDA_VISIBLE_DEVICES") in os.environ.get("HANGING_GPUS", "").split(","):
        time.sleep(3600)
    sys.exit(device_worker.main())
