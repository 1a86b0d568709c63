# Chunked MN-major loads at the power limit (A/B in turns), then bench_gemm_hopper on NN cases.
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
PYTHONPATH=/tmp/site:$PWD timeout 200 python .diag/run/chunk_ab.py > $OUT/chunk_ab.log 2>&1; echo "ab rc=$?"; grep -v Warning $OUT/chunk_ab.log | tail -12
PYTHONPATH=/tmp/site:$PWD timeout 330 python benchmarks/bench_gemm_hopper.py --only 4096³ "llama o" "llama up 2048" "llama down 2048" > $OUT/gemm.log 2>&1; echo "bench rc=$?"
grep "^|" $OUT/bench_gemm_hopper.md | cut -d'|' -f2-8,10,12
nvidia-smi --query-gpu=clocks_event_reasons_counters.sw_thermal_slowdown,clocks_event_reasons_counters.hw_thermal_slowdown,temperature.gpu --format=csv
