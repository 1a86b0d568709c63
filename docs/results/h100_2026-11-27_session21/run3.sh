# the tuner's hot retime turn by turn (4096^3 NT, NN x3), then 128x256 vs 256x128 at the power limit (NT)
nvidia-smi --query-gpu=name,serial,temperature.gpu,clocks.sm,power.draw --format=csv
timeout 300 python .diag/r21/retime_probe.py 2>&1 | grep -v Warning | tee $OUT/retime_probe.log
mkdir -p $OUT/energy_nt && OUT=$OUT/energy_nt timeout 200 python benchmarks/bench_energy.py --shape 4096 4096 4096 --layout NT --tile 128x256 --tile 256x128 --seconds 1.5 --turns 4 2>&1 | grep -v Warning | tail -8
