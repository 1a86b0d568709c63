"""Summarize trace.py's log: per kernel, the slowest CTA's cycles, and per wave (a CTA's q-th
tile) the main loop's cycles on each half of the SMs (FAST: the SM set that stayed fast in
run 2), against the ideal 1024 cycles a 128x256x64 step."""
import sys, collections
import numpy as np

HALF_A = {0, 1, 8, 9, 10, 11, 12, 13, 16, 17, 24, 25, 26, 27, 28, 29, 32, 33, 40, 41, 42, 43, 44, 45, 48, 49, 56, 57,
          58, 59, 60, 61, 70, 71, 72, 73, 74, 75, 84, 85, 86, 87, 88, 89, 98, 99, 100, 101, 102, 103, 112, 113, 114,
          115, 116, 117, 120, 121, 124, 125, 126, 127, 128, 129, 130, 131}
cases, cur = [], None
for ln in open(sys.argv[1]).read().splitlines():
    if ln.startswith("CASE "):
        key, tname, m, n, k, bm, bn = ln[5:].split("|")
        cur = {"name": f"{key} {tname}", "mnk": (int(m), int(n), int(k)), "bm": int(bm), "bn": int(bn), "ctas": {}, "tiles": collections.defaultdict(dict)}
        cases.append(cur)
    elif ln.startswith("FDL ") and cur:
        l, bid, sm, g0, g1, e, t0 = map(int, ln.split()[1:])
        cur["ctas"][(l, bid)] = dict(sm=sm, g0=g0, g1=g1, e=e, t0=t0)
    elif ln.startswith("FDT ") and cur:
        l, bid, q, a, b, c, mm, nn = map(int, ln.split()[1:])
        cur["tiles"][(l, bid)][q] = (a, b, c, mm, nn)
    elif ln.startswith("MS ") and cur:
        cur["ms"] = float(ln.split()[1])
for c in cases:
    m, n, k = c["mnk"]
    ideal = -(-k // 64) * c["bm"] * c["bn"] * 64 / 2048
    ntiles = -(-m // c["bm"]) * -(-n // c["bn"])
    launches = sorted({l for l, _ in c["ctas"]})
    print(f"== {c['name']}: {c.get('ms')} ms a launch (200 ms of queued launches); ideal main loop {ideal:.0f} cycles a tile")
    for l in launches:
        cs = {b: v for (ll, b), v in c["ctas"].items() if ll == l}
        workers = len(cs)
        tot = [v["e"] - v["t0"] for v in cs.values()]
        span = (max(v["g1"] for v in cs.values()) - min(v["g0"] for v in cs.values())) / 1e3
        waves = collections.defaultdict(lambda: collections.defaultdict(list))
        first = collections.defaultdict(list)
        for b, v in cs.items():
            half = "A" if v["sm"] in HALF_A else "B"
            for q, (ta, tb, tc, mm, nn) in c["tiles"][(l, b)].items():
                if b + q * workers < ntiles or c["bm"] == 0:
                    waves[q][half].append(tc - tb)
                    first[q].append(tb - ta)
        print(f" launch {l}: span {span:.1f} us; CTA cycles max {max(tot)}, median {int(np.median(tot))}, min {min(tot)}")
        for q in sorted(waves):
            d = waves[q]
            parts = "  ".join(f"{h}: n={len(v):3d} med {np.median(v) / ideal:.3f} max {max(v) / ideal:.3f}" for h, v in sorted(d.items()))
            print(f"   wave {q}: {parts}  | wait first stage med {int(np.median(first[q]))}")
