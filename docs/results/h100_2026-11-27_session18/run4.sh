nvidia-smi --query-gpu=name,temperature.gpu,clocks.sm,power.draw --format=csv
python .diag/r18/trace.py (here trace_diag.py) --only direct > $OUT/trace.log 2> $OUT/trace.err; echo "rc=$?"
tail -3 $OUT/trace.err
python .diag/r18/trace_report.py $OUT/trace.log | tee $OUT/trace_report.txt
timeout 240 python -m pytest -q -m gpu tests/schedules/test_matmul_wgmma_gpu.py 2>&1 | tail -4 | tee $OUT/gpu_tests.log
python .diag/r18/ab_direct.py --only 4096NN 4096NT down4096 o2048 2>&1 | grep -v Warning | tee $OUT/ab.log
