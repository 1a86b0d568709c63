set -x
nvidia-smi --query-gpu=name,temperature.gpu,clocks.sm,power.draw,clocks_event_reasons.active --format=csv
python .diag/r17/hint.py --set2 --only 4096 8192 2>&1 | grep -v Warning | tee $OUT/hint.log
nvidia-smi --query-gpu=name,temperature.gpu,clocks.sm,power.draw --format=csv
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_lookup_hit.sum,lts__t_sectors_lookup_miss.sum
timeout 300 ncu --metrics $M --kernel-name regex:"fdl_|nvjet" --csv python .diag/r17/hint.py --set2 --ncu > $OUT/ncu.csv 2> $OUT/ncu.err; echo "ncu rc=$?"
tail -3 $OUT/ncu.err
python - <<'PY'
import csv, os, collections
rows = list(csv.reader(open(os.environ["OUT"] + "/ncu.csv")))
hdr = next(i for i, r in enumerate(rows) if r and r[0] == "ID")
h = rows[hdr]; ki, mi, vi = h.index("Kernel Name"), h.index("Metric Name"), h.index("Metric Value")
d = collections.OrderedDict()
for r in rows[hdr + 1:]:
    if len(r) > vi:
        d.setdefault((r[0], r[ki][:50]), {})[r[mi]] = r[vi]
for (i, k), m in d.items():
    print(i, k, " | ".join(f"{n.split('.')[0].split('__')[-1]}={v}" for n, v in m.items()))
PY
