# bench_gemm_hopper on 4096³ and 8192³ (session 18: the code of session 17, unchanged kernels).
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
timeout 520 python benchmarks/bench_gemm_hopper.py --only 4096³ 8192³ > $OUT/gemm.log 2>&1; echo "bench rc=$?"
grep "^|" $OUT/bench_gemm_hopper.md | cut -d'|' -f2-8,9,10,12
nvidia-smi --query-gpu=clocks_event_reasons_counters.sw_thermal_slowdown,temperature.gpu --format=csv,noheader
