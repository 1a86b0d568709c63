timeout 240 python -m pytest -q -m gpu tests/schedules/test_matmul_wgmma_gpu.py 2>&1 | tail -3
for t in "128x256" "256x128 --warp-m 128"; do
  python benchmarks/trace_wgmma.py --shape 4096 4096 4096 --tile $t 2>&1 | grep -v Warning | grep -E "^Launch|^\| [0-9]"
done
python benchmarks/trace_wgmma.py --shape 4096 4096 11008 --tile 128x256 2>&1 | grep -v Warning | grep -E "^Launch|^\| [0-9]"
