# estimate finalists within 15%: 8192^3 first passes and picks; 4096^3 first tune time
nvidia-smi --query-gpu=name,serial,temperature.gpu,clocks.sm,power.draw --format=csv
timeout 200 python .diag/r21/finalist_probe.py 2>&1 | grep -v Warning | tee $OUT/finalist_probe.log | grep "==\|FINALIST\|hot"
timeout 120 python benchmarks/bench_gemm_hopper.py --only 4096³ > $OUT/gemm.log 2>&1; echo "bench rc=$?"
grep -h "^|" $OUT/bench_gemm_hopper.md | cut -d'|' -f2-8,9,10,12
