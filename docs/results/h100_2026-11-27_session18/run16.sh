python benchmarks/trace_wgmma.py --shape 4096 4096 4096 --tile 128x256 2>&1 | grep -v Warning | grep -E "^Launch|^\| [0-9]"
python benchmarks/trace_wgmma.py --shape 2048 4096 4096 --tile 256x128 --warp-m 128 --group 8 2>&1 | grep -v Warning | grep -E "^Launch|^\| [0-9]"
python benchmarks/trace_wgmma.py --shape 4096 4096 4096 --tile 96x96 2>&1 | tail -1
