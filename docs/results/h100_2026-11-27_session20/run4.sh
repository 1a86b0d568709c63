# session 20 run 4: decode and batched GEMMs; the models, with the new policy cost
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu,serial --format=csv,noheader
timeout 130 python benchmarks/bench_gemm_hopper.py --only decode batched > $OUT/gemm.log 2>&1; echo "bench rc=$?"
grep -h "^|" $OUT/bench_gemm_hopper.md | cut -d'|' -f2-8,9,10,12
mkdir -p $OUT/models
timeout 300 python benchmarks/bench_models.py --models mlp_gelu,mlp_silu,decoder_ln --out $OUT/models > $OUT/models.log 2>&1; echo "models rc=$?"
tail -7 $OUT/models.log | cut -c1-250
