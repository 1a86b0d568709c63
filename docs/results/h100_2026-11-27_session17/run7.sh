# GPU tests: CUDA-core matmul (the 16-byte epilogue vectors), wgmma template (snake order), tuning (5% cluster tie).
nvidia-smi --query-gpu=name,temperature.gpu --format=csv,noheader
timeout 500 python -m pytest -q -m gpu tests/schedules/test_matmul_cuda_core_gpu.py tests/schedules/test_matmul_wgmma_gpu.py tests/tune 2>&1 | tail -6 | tee $OUT/gpu_tests.log
