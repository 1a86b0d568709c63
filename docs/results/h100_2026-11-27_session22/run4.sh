# the final code: odd shapes, batched, decode; then the model MLPs and decoder
nvidia-smi --query-gpu=name,serial,temperature.gpu,clocks.sm,power.draw --format=csv
timeout 300 python benchmarks/bench_gemm_hopper.py --only odd aligned batched decode > $OUT/gemm.log 2>&1; echo "bench rc=$?"
grep -h "^|" $OUT/bench_gemm_hopper.md | cut -d'|' -f2-8,9,10,12
mkdir -p $OUT/models
timeout 200 python benchmarks/bench_models.py --models mlp_gelu,mlp_silu,decoder_ln --out $OUT/models > $OUT/models.log 2>&1; echo "models rc=$?"
tail -6 $OUT/models.log | cut -c1-250
