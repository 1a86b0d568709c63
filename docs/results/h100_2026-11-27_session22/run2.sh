O=$OUT
nvidia-smi --query-gpu=name,serial --format=csv,noheader
mkdir -p $O/nn4096 $O/down4096
OUT=$O/nn4096 python benchmarks/bench_energy.py --shape 4096 4096 4096 --layout NN --tile 128x256 --tile 64x256/64 --tile 64x256/64+2m --tile 128x256+2m --seconds 2 --turns 2 2>&1 | tail -25
OUT=$O/down4096 python benchmarks/bench_energy.py --shape 4096 4096 11008 --layout NN --tile 128x256 --tile 64x256/64+2m --seconds 2 --turns 2 2>&1 | tail -15
