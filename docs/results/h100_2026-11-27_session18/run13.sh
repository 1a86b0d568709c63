nvidia-smi --query-gpu=name,temperature.gpu,clocks.sm,power.draw --format=csv
timeout 570 python .diag/r18/ab_tall_wide.py --only qkv2048 o2048 down2048 up4096 down4096 4096NN 8192NN 2>&1 | grep -v Warning | grep -v "max rel err" | tee $OUT/ab.log
grep -c OK $OUT/ab.log
