# odd shapes and the models with 192-wide two-slice tiles among the candidates (session 19)
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu,serial --format=csv,noheader
timeout 150 python benchmarks/bench_gemm_hopper.py --only odd > $OUT/gemm_odd.log 2>&1; echo "bench rc=$?"
grep -h "^|" $OUT/bench_gemm_hopper.md | cut -d'|' -f2-8,9,10,12
mkdir -p $OUT/models
timeout 380 python benchmarks/bench_models.py --models mlp_gelu,mlp_silu,decoder_ln --out $OUT/models > $OUT/models.log 2>&1; echo "models rc=$?"
tail -8 $OUT/models.log | cut -c1-250
nvidia-smi --query-gpu=clocks_event_reasons_counters.sw_thermal_slowdown,temperature.gpu --format=csv,noheader
