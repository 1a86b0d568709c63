# session 20 run 1: bench_energy's GPU test; the large GEMM targets with the final policy; LLaMA o tiles at the power limit
nvidia-smi --query-gpu=name,clocks.sm,power.draw,power.limit,temperature.gpu,serial --format=csv,noheader
python -m pytest -q -x tests/test_bench_energy.py -m gpu 2>&1 | tail -3
timeout 300 python benchmarks/bench_gemm_hopper.py --only 4096³ 8192³ llama > $OUT/gemm.log 2>&1; echo "bench rc=$?"
grep -h "^|" $OUT/bench_gemm_hopper.md | cut -d'|' -f2-8,9,10,12
mkdir -p $OUT/energy_o && OUT=$OUT/energy_o timeout 120 python benchmarks/bench_energy.py --shape 2048 4096 4096 --layout NN --tile 128x256 --tile 256x128 --seconds 2 --turns 2 > $OUT/energy_o.log 2>&1; echo "energy rc=$?"
tail -12 $OUT/energy_o.log | cut -c1-250
nvidia-smi --query-gpu=clocks_event_reasons_counters.sw_thermal_slowdown,temperature.gpu --format=csv,noheader
