# estimate finalists within 10% of the first pass's fastest: 8192^3 first passes and picks, then 4096^3 and 8192^3
nvidia-smi --query-gpu=name,serial,temperature.gpu,clocks.sm,power.draw --format=csv
timeout 200 python .diag/r21/finalist_probe.py 2>&1 | grep -v Warning | tee $OUT/finalist_probe.log
timeout 240 python benchmarks/bench_gemm_hopper.py --only 4096³ 8192³ > $OUT/gemm.log 2>&1; echo "bench rc=$?"
grep -h "^|" $OUT/bench_gemm_hopper.md | cut -d'|' -f2-8,9,10,12
