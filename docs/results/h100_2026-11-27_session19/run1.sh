nvidia-smi --query-gpu=name,temperature.gpu,clocks.sm,power.draw,power.limit --format=csv
python -m pytest -q -x tests/schedules/test_matmul_wgmma_gpu.py 2>&1 | tail -3
timeout 420 python .diag/r19/ab_wide192.py --only 4096NN 8192NN qkv2048 up2048 down4096 4096NT 2>&1 | grep -v Warning | tee $OUT/ab.log
