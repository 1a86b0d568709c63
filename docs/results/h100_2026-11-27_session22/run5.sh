# after the refactors: GPU tests of the mma.sync template, the export, bench_course; bench_course itself (no MetaSchedule)
nvidia-smi --query-gpu=name,serial --format=csv,noheader
timeout 300 python -m pytest -q -m gpu tests/schedules/test_matmul_tensorcore_gpu.py tests/test_export.py tests/test_bench_course.py 2>&1 | tail -4 | tee $OUT/gpu_tests.log
timeout 250 python benchmarks/bench_course.py --skip-ms --out $OUT/course > $OUT/course.log 2>&1; echo "course rc=$?"
grep "^|" $OUT/course/bench_course.md | cut -c1-200
