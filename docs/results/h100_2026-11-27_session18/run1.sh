nvidia-smi --query-gpu=name,temperature.gpu,clocks.sm,power.draw,power.limit --format=csv
timeout 240 python -m pytest -q -m gpu tests/schedules/test_matmul_wgmma_gpu.py 2>&1 | tail -4 | tee $OUT/gpu_tests.log
python .diag/r18/ab_pdl.py 2>&1 | grep -v Warning | tee $OUT/ab.log
nvidia-smi --query-gpu=name,temperature.gpu,clocks.sm,power.draw --format=csv
