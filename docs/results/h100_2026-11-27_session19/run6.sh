# the final policy: bf16 8192³ NN and the LayerNorm decoder (run 2 and 3 picked a ping-pong 128x192 there) (session 19)
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu,serial --format=csv,noheader
timeout 100 python benchmarks/bench_gemm_hopper.py --only "bf16 8192" > $OUT/gemm.log 2>&1; echo "bench rc=$?"
grep -h "^|" $OUT/bench_gemm_hopper.md | cut -d'|' -f2-8,9,10,12
mkdir -p $OUT/models
timeout 110 python benchmarks/bench_models.py --models decoder_ln --out $OUT/models > $OUT/models.log 2>&1; echo "models rc=$?"
tail -6 $OUT/models.log | cut -c1-250
