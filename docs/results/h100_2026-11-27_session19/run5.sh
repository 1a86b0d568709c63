# the final policy (ping-pong warpgroups up to 128 accumulators, cooperative up to 192) on the odd shapes and qkv (session 19)
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu,serial --format=csv,noheader
timeout 250 python benchmarks/bench_gemm_hopper.py --only "odd 3000" "odd K" qkv > $OUT/gemm.log 2>&1; echo "bench rc=$?"
grep -h "^|" $OUT/bench_gemm_hopper.md | cut -d'|' -f2-8,9,10,12
