# The chunked MN-major loads: GPU tests of the wgmma template, then bench_gemm_hopper on 4096³.
nvidia-smi --query-gpu=name --format=csv,noheader
PYTHONPATH=/tmp/site:$PWD timeout 330 python -m pytest -q -p no:cacheprovider -n 4 tests/schedules/test_matmul_wgmma_gpu.py > $OUT/pytest_wgmma_gpu.log 2>&1; echo "pytest rc=$?"; tail -4 $OUT/pytest_wgmma_gpu.log | cut -c1-300
PYTHONPATH=/tmp/site:$PWD timeout 220 python benchmarks/bench_gemm_hopper.py --only 4096³ > $OUT/gemm.log 2>&1; echo "bench rc=$?"
grep "^|" $OUT/bench_gemm_hopper.md | cut -d'|' -f2-8,10,12
grep -n "^==\|verified=True" $OUT/bench_gemm_hopper.log | cut -c1-150 | head -20
