# batched epilogue, lent stage released at the next tile's first K step: trace and A/B
nvidia-smi --query-gpu=name,serial,temperature.gpu,clocks.sm,power.draw --format=csv
timeout 120 python .diag/r21/trace_ab.py 2>&1 | grep -v Warning > $OUT/trace.log; grep -A14 "^== 128x256\|^== 256x128" $OUT/trace.log | grep -v "^$" | head -80
python .diag/r21/ab.py --only 4096NN 4096NT 8192NT down4096 up 2>&1 | grep -v Warning | tee $OUT/ab.log
