# session 20 run 2: which quick timing ranks tiles as the power limit does (rankers.py)
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu,serial --format=csv,noheader
timeout 500 python .diag/r20/rankers.py --only 8192NT up2048 4096NN down4096 2>&1 | grep -v Warning | tee $OUT/rankers.log
