nvidia-smi --query-gpu=name,temperature.gpu,clocks.sm,power.draw,power.limit,clocks.max.sm --format=csv
python benchmarks/bench_energy.py --only 4096 8192 --seconds 3 2>&1 | grep -v Warning | tail -12
nvidia-smi --query-gpu=name,temperature.gpu,clocks.sm,power.draw --format=csv
