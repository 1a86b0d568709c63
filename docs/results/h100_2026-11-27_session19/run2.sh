# bench_gemm_hopper with 256x192 tiles among the candidates (session 19)
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu,serial --format=csv,noheader
timeout 275 python benchmarks/bench_gemm_hopper.py --only 4096³ 8192³ > $OUT/gemm_a.log 2>&1; echo "bench rc=$?"
mkdir -p $OUT/a && mv $OUT/bench_gemm_hopper.* $OUT/a/
timeout 275 python benchmarks/bench_gemm_hopper.py --only llama > $OUT/gemm_b.log 2>&1; echo "bench rc=$?"
mkdir -p $OUT/b && mv $OUT/bench_gemm_hopper.* $OUT/b/
grep -h "^|" $OUT/a/bench_gemm_hopper.md $OUT/b/bench_gemm_hopper.md | cut -d'|' -f2-8,9,10,12
nvidia-smi --query-gpu=clocks_event_reasons_counters.sw_thermal_slowdown,temperature.gpu --format=csv,noheader
