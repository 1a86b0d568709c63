# ncu: 4096³ NN plain and cluster tiles, and cuBLAS's kernels for both.
nvidia-smi --query-gpu=name --format=csv,noheader
M=gpu__time_duration.sum,smsp__inst_executed.sum,lts__t_bytes.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sectors_lookup_hit.sum,lts__t_sectors_lookup_miss.sum,smsp__warp_issue_stalled_barrier_per_warp_active.pct,smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct,sm__cycles_active.avg,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_requests_srcunit_tex_op_read.sum
PYTHONPATH=/tmp/site:$PWD timeout 400 ncu --metrics $M --kernel-name regex:"fdl_|nvjet" --csv python .diag/run/ncu_cluster.py > $OUT/ncu.csv 2> $OUT/ncu.err; echo "rc=$?"
tail -3 $OUT/ncu.err
python - <<'PY'
import csv, os, collections
rows = list(csv.reader(open(os.environ["OUT"] + "/ncu.csv")))
hdr = next(i for i, r in enumerate(rows) if r and r[0] == "ID")
h = rows[hdr]; ki, mi, vi = h.index("Kernel Name"), h.index("Metric Name"), h.index("Metric Value")
d = collections.OrderedDict()
for r in rows[hdr + 1:]:
    if len(r) > vi:
        d.setdefault((r[0], r[ki][:60]), {})[r[mi]] = r[vi]
for (i, k), m in d.items():
    print(i, k, " | ".join(f"{n.split('.')[0].split('__')[-1]}={v}" for n, v in m.items()))
PY
