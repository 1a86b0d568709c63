# the hot tie by estimate: the retime probe's picks (4096^3 NT, NN x3), then bench_gemm_hopper on 4096^3, 8192^3 and LLaMA
nvidia-smi --query-gpu=name,serial,temperature.gpu,clocks.sm,power.draw --format=csv
timeout 200 python .diag/r21/retime_probe.py 2>&1 | grep -v Warning > $OUT/retime_probe.log; grep "==\|hot" $OUT/retime_probe.log
timeout 360 python benchmarks/bench_gemm_hopper.py --only 4096³ 8192³ llama > $OUT/gemm.log 2>&1; echo "bench rc=$?"
grep -h "^|" $OUT/bench_gemm_hopper.md | cut -d'|' -f2-8,9,10,12
