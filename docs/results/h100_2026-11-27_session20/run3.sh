# session 20 run 3: the large GEMMs and odd shapes with the policy's shared-memory term, L2 factor 4, and plain tiles in a cluster tie by estimate
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu,serial --format=csv,noheader
timeout 330 python benchmarks/bench_gemm_hopper.py --only 4096³ 8192³ llama > $OUT/gemm.log 2>&1; echo "bench rc=$?"
mkdir -p $OUT/a && mv $OUT/bench_gemm_hopper.* $OUT/a/
grep -h "^|" $OUT/a/bench_gemm_hopper.md | cut -d'|' -f2-8,9,10,12
timeout 150 python benchmarks/bench_gemm_hopper.py --only odd aligned > $OUT/gemm_odd.log 2>&1; echo "bench rc=$?"
mkdir -p $OUT/b && mv $OUT/bench_gemm_hopper.* $OUT/b/
grep -h "^|" $OUT/b/bench_gemm_hopper.md | cut -d'|' -f2-8,9,10,12
nvidia-smi --query-gpu=clocks_event_reasons_counters.sw_thermal_slowdown,temperature.gpu --format=csv,noheader
