# bench_models on the MLPs and the LayerNorm decoder with the final code (the cluster tie rule).
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
PYTHONPATH=/tmp/site:$PWD timeout 580 python benchmarks/bench_models.py --models mlp_gelu,mlp_silu,decoder_ln --out $OUT/models > $OUT/models.log 2>&1; echo "rc=$?"
tail -12 $OUT/models.log | cut -c1-250
