# session 20 run 6: the final code's 4096³ and 8192³ on another machine
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu,serial --format=csv,noheader
timeout 170 python benchmarks/bench_gemm_hopper.py --only 4096³ 8192³ > $OUT/gemm.log 2>&1; echo "bench rc=$?"
grep -h "^|" $OUT/bench_gemm_hopper.md | cut -d'|' -f2-8,9,10,12
