# bench_gemm_hopper 4096³ with the 5% cluster tie; bench_models MLPs + LayerNorm decoder (snake order).
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
timeout 200 python benchmarks/bench_gemm_hopper.py --only 4096³ > $OUT/gemm.log 2>&1; echo "bench rc=$?"
grep "^|" $OUT/bench_gemm_hopper.md | cut -d'|' -f2-8,9,10,12
mkdir -p $OUT/models
timeout 380 python benchmarks/bench_models.py --models mlp_gelu,mlp_silu,decoder_ln --out $OUT/models > $OUT/models.log 2>&1; echo "models rc=$?"
tail -8 $OUT/models.log | cut -c1-250
nvidia-smi --query-gpu=clocks_event_reasons_counters.sw_thermal_slowdown,temperature.gpu --format=csv,noheader
