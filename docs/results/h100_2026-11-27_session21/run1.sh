# batched epilogue: GPU correctness tests, trace old/new, power-limit A/B with cuBLAS
nvidia-smi --query-gpu=name,serial,temperature.gpu,clocks.sm,power.draw --format=csv
timeout 240 python -m pytest -q -m gpu tests/schedules/test_matmul_wgmma_gpu.py -x 2>&1 | tail -5 | tee $OUT/gpu_tests.log
timeout 120 python .diag/r21/trace_ab.py 2>&1 | grep -v Warning | tail -80 > $OUT/trace.log; tail -60 $OUT/trace.log
python .diag/r21/ab.py --only 4096NN 4096NT down4096 8192NT up 2>&1 | grep -v Warning | tee $OUT/ab.log
