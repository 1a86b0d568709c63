python .diag/r18/trace.py (here trace_diag.py) --only nowait > $OUT/trace.log 2> $OUT/trace.err; echo "rc=$?"
tail -3 $OUT/trace.err
python .diag/r18/trace_report.py $OUT/trace.log > $OUT/trace_report.txt
python - <<'PY'
import os, collections, numpy as np
cur=None; d=collections.OrderedDict()
for ln in open(os.environ["OUT"] + "/trace.log"):
    if ln.startswith("CASE"): cur=ln.split("|")[1]; d[cur]=collections.defaultdict(dict); continue
    if ln.startswith("FDT") and cur:
        l,b,q,a,bb,c,m,n=map(int,ln.split()[1:]); d[cur][(l,b)][q]=(a,bb,c)
for name,t in d.items():
    epi=[]; ml=[]
    for (l,b),qs in t.items():
        for q in range(3):
            if q in qs and q+1 in qs: epi.append(qs[q+1][0]-qs[q][2]); ml.append(qs[q][2]-qs[q][1])
    print(name, "epilogue between tiles median", int(np.median(epi)), "p90", int(np.percentile(epi,90)), "| main loop median", int(np.median(ml)))
PY
grep -n "CTA cycles" $OUT/trace_report.txt
