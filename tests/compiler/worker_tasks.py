"""Tasks for the worker pool's tests: module-level (pickled by reference) and light to import."""

import ctypes
import os
import time


def square(x):
    return x * x


def fail(x):
    raise ValueError(f"bad input {x}")


def abort(x):
    os.abort()


def hold_gil(x):
    # PyDLL does not release the GIL: a hang the worker's own threads could not interrupt.
    ctypes.PyDLL(None).sleep(600)


def pid(x):
    return os.getpid()


def slow_pid(seconds):
    time.sleep(seconds)
    return os.getpid()


def slow_note(path):
    time.sleep(0.5)
    note(path)


def note(path):
    with open(path, "a") as f:
        f.write(f"{os.getpid()}\n")


def torch_module(x):
    # here, not at the top: the task runs in a worker process, which unpickles it by name
    import sys

    return repr(sys.modules.get("torch", "absent"))
