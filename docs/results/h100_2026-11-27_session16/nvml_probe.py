"""How fine NVML's energy counter is on this GPU, and how noisy energy per GEMM is in short windows."""
import ctypes, time, statistics as st
import torch
lib = ctypes.CDLL("libnvidia-ml.so.1"); assert lib.nvmlInit_v2() == 0
dev = ctypes.c_void_p(); lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(dev))
def energy():
    v = ctypes.c_ulonglong(); lib.nvmlDeviceGetTotalEnergyConsumption(dev, ctypes.byref(v)); return v.value
t = time.perf_counter(); n = 0
for _ in range(1000): energy(); n += 1
print(f"one read: {(time.perf_counter() - t) / n * 1e6:.1f} us")
a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16); b = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
bt = torch.randn(4096, 4096, device="cuda", dtype=torch.float16).t()
for _ in range(2000): torch.matmul(a, b)
# update period
changes = []; last = energy(); t0 = time.perf_counter()
while time.perf_counter() - t0 < 0.5:
    e = energy()
    if e != last: changes.append((time.perf_counter() - t0, e - last)); last = e
torch.cuda.synchronize()
gaps = [changes[i][0] - changes[i-1][0] for i in range(1, len(changes))]
print(f"{len(changes)} changes in 0.5 s; gap median {st.median(gaps)*1e3:.2f} ms, min {min(gaps)*1e3:.2f}, max {max(gaps)*1e3:.2f}; increments median {st.median(c[1] for c in changes)} mJ")
def window(fn, ms):
    # queue enough work, measure energy and events over the window
    torch.cuda.synchronize()
    s, e_ = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    n = max(1, int(ms / 0.2))
    e0 = energy(); t0 = time.perf_counter(); s.record()
    for _ in range(n): fn()
    e_.record(); torch.cuda.synchronize(); e1 = energy(); t1 = time.perf_counter()
    return (e1 - e0) / n, s.elapsed_time(e_) / n, (e1 - e0) / (t1 - t0)
fa = lambda: torch.matmul(a, b); fb = lambda: torch.matmul(a, bt)
for ms in (33, 133, 400, 1500):
    res = {"NN": [], "NT": []}
    for r in range(6):
        for name, fn in (("NN", fa), ("NT", fb)) if r % 2 == 0 else (("NT", fb), ("NN", fa)):
            window(fn, 100)  # own heat
            res[name].append(window(fn, ms))
    for name, v in res.items():
        mj = [x[0] for x in v]; t = [x[1] for x in v]; w = [x[2] for x in v]
        print(f"window {ms:5d} ms {name}: mJ/GEMM {st.median(mj):7.2f} (cv {st.pstdev(mj)/st.mean(mj)*100:4.1f}%) ms {st.median(t):.4f} (cv {st.pstdev(t)/st.mean(t)*100:4.1f}%) W {st.median(w):5.0f}")
