"""Diagnostics: how long build workers take to start (imports, initializer), alone and 16 at once."""
import os, subprocess, sys, time

t0 = time.time()
subprocess.run([sys.executable, "-c", "import tvm"], check=True)
t1 = time.time()
subprocess.run([sys.executable, "-c", "import fastdlight.compiler.build_task as b; b.init_worker()"], check=True)
t2 = time.time()
print(f"one process: import tvm {t1 - t0:.2f} s; import + init_worker {t2 - t1:.2f} s", flush=True)
out = subprocess.run([sys.executable, "-X", "importtime", "-c", "import fastdlight.compiler.build_task as b; b.init_worker()"],
                     capture_output=True, text=True).stderr.splitlines()
rows = []
for line in out:
    if line.startswith("import time:") and "|" in line:
        parts = line.split("|")
        try:
            rows.append((int(parts[1]), parts[2].rstrip()))
        except ValueError:
            pass
for us, name in sorted(rows, reverse=True)[:15]:
    print(f"  cumulative {us / 1e6:6.2f} s  {name}")
n = int(sys.argv[1]) if len(sys.argv) > 1 else 16
t3 = time.time()
procs = [subprocess.Popen([sys.executable, "-c", "import fastdlight.compiler.build_task as b; b.init_worker()"]) for _ in range(n)]
for p in procs:
    p.wait()
print(f"{n} at once: {time.time() - t3:.2f} s", flush=True)
from fastdlight.compiler.workers import WorkerPool
from fastdlight.compiler import build_task
t4 = time.time()
pool = WorkerPool(n, initializer=build_task.init_worker)
pool.warm_up()
while len(pool.ready_times()) < n and time.time() - t4 < 60:
    time.sleep(0.05)
print("pool ready:", [round(t - t4, 2) for t in pool.ready_times()], flush=True)
pool.close()
