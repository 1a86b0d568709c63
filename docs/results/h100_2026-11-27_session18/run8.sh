set -x
python benchmarks/trace_wgmma.py --shape 4096 4096 4096 --tile 128x256 2>&1 | grep -v Warning | tail -14
mkdir -p $OUT/a && cp $OUT/trace_wgmma.* $OUT/a/
python benchmarks/trace_wgmma.py --shape 4096 4096 4096 --tile 256x128 --warp-m 128 2>&1 | grep -v Warning | tail -14
mkdir -p $OUT/b && cp $OUT/trace_wgmma.* $OUT/b/
python benchmarks/trace_wgmma.py --shape 4096 4096 4096 --tile 128x256 --cluster 2 --group 8 2>&1 | grep -v Warning | tail -14
mkdir -p $OUT/c && cp $OUT/trace_wgmma.* $OUT/c/
python benchmarks/trace_wgmma.py --shape 8192 8192 8192 --tile 128x256 2>&1 | grep -v Warning | tail -24
mkdir -p $OUT/d && cp $OUT/trace_wgmma.* $OUT/d/
python benchmarks/trace_wgmma.py --shape 4096 4096 11008 --tile 128x256 --layout NN 2>&1 | grep -v Warning | tail -14
mkdir -p $OUT/e && cp $OUT/trace_wgmma.* $OUT/e/
