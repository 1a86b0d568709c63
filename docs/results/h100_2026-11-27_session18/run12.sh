# bench_gemm_hopper on the LLaMA shapes (session 18).
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
timeout 420 python benchmarks/bench_gemm_hopper.py --only llama > $OUT/gemm.log 2>&1; echo "bench rc=$?"
grep "^|" $OUT/bench_gemm_hopper.md | cut -d'|' -f2-8,9,10,12
nvidia-smi --query-gpu=clocks_event_reasons_counters.sw_thermal_slowdown,temperature.gpu --format=csv,noheader
