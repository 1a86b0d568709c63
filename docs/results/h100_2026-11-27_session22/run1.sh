set -x
nvidia-smi --query-gpu=name,serial,power.limit,clocks.max.sm --format=csv
python .diag/r22/smem_probe.py 2>&1 | grep -v "^FD[LT]" | tail -40
