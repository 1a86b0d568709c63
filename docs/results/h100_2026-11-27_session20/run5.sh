# session 20 run 5: GPU tests with the final code (wgmma template, Relax pass, dynamic dispatch, tuner)
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu,serial --format=csv,noheader
timeout 420 python -m pytest -q -m gpu tests/schedules/test_matmul_wgmma_gpu.py tests/relax tests/tune/test_dynamic.py tests/tune/test_apply_and_build.py tests/tune/test_candidates.py tests/test_bench_energy.py 2>&1 | tail -6 | tee $OUT/gpu_tests.log
