# bench_gemm_hopper with the cluster tie rule: 4096³, 8192³, LLaMA o and down at 2048 tokens.
mkdir -p $OUT/logs
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
PYTHONPATH=/tmp/site:$PWD timeout 560 python benchmarks/bench_gemm_hopper.py --only 4096³ 8192³ "llama o" "llama down 2048" > $OUT/logs/gemm.log 2>&1; echo "bench rc=$?"
grep "^|" $OUT/bench_gemm_hopper.md | cut -d'|' -f2-8,10,12 
grep -n "^==\|Config\[matmul_wgmma\].*hot\|verified=True" $OUT/bench_gemm_hopper.log | head -40
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $OUT/logs
