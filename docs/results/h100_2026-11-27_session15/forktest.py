"""Worker start-up: N fresh processes importing TVM + init_worker at once, against one process
that imports them and then forks N children."""
import os, sys, time, subprocess
N, mode = int(sys.argv[1]), sys.argv[2]
t0 = time.time()
CODE = "import sys; sys.modules['torch'] = None; import time; from fastdlight.tune import build_task; build_task.init_worker(cuda_only=True); print(time.time())"
if mode == "popen":
    procs = [subprocess.Popen([sys.executable, "-c", CODE], stdout=subprocess.PIPE) for _ in range(N)]
    ends = sorted(float(p.communicate()[0]) - t0 for p in procs)
    print(f"popen N={N}: ready {ends[0]:.2f}-{ends[-1]:.2f} s")
else:
    z = subprocess.Popen([sys.executable, "-c", CODE + f"""
import os, sys
for _ in range({N}):
    if os.fork() == 0:
        print('child', time.time(), flush=True); os._exit(0)
for _ in range({N}): os.wait()
"""], stdout=subprocess.PIPE, text=True)
    out = z.communicate()[0].split("\n")
    zready = float(out[0]) - t0
    ends = sorted(float(l.split()[1]) - t0 for l in out if l.startswith("child"))
    print(f"fork N={N}: zygote ready {zready:.2f} s, children {ends[0]:.2f}-{ends[-1]:.2f} s")
