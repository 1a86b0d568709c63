# the final code, unchanged since session 21: 4096^3, 8192^3 and LLaMA in one run
nvidia-smi --query-gpu=name,serial,temperature.gpu,clocks.sm,power.draw --format=csv
timeout 560 python benchmarks/bench_gemm_hopper.py --only 4096³ 8192³ llama > $OUT/gemm.log 2>&1; echo "bench rc=$?"
grep -h "^|" $OUT/bench_gemm_hopper.md | cut -d'|' -f2-8,9,10,12
