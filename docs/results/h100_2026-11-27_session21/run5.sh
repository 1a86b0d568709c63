# the final code: GPU tests of the tuner's pick path, the Relax pass and the wgmma template; decode, batched; the models
nvidia-smi --query-gpu=name,serial,temperature.gpu,clocks.sm,power.draw --format=csv
timeout 280 python -m pytest -q -m gpu tests/tune/test_apply_and_build.py tests/tune/test_candidates.py tests/relax/test_apply_fast_tuning.py tests/test_bench_energy.py 2>&1 | tail -4 | tee $OUT/gpu_tests.log
timeout 130 python benchmarks/bench_gemm_hopper.py --only decode batched > $OUT/gemm.log 2>&1; echo "bench rc=$?"
grep -h "^|" $OUT/bench_gemm_hopper.md | cut -d'|' -f2-8,9,10,12
mkdir -p $OUT/models
timeout 170 python benchmarks/bench_models.py --models mlp_gelu,mlp_silu,decoder_ln --out $OUT/models > $OUT/models.log 2>&1; echo "models rc=$?"
tail -6 $OUT/models.log | cut -c1-250
