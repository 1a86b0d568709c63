# 128x192 ping-pong (two m64n192 slices a warpgroup) against 128x256 at the power limit (session 19)
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu,serial --format=csv,noheader
AB_SHAPES="128,192,128,2 128,256,64,2" timeout 200 python .diag/r19/ab_wide192.py --only odd3000 oddK 2>&1 | grep -v Warning | tee $OUT/ab_odd.log
AB_SHAPES="128,192,128,1 128,256,64,1 128,192,64,1" timeout 200 python .diag/r19/ab_wide192.py --only 8192bfNN 2>&1 | grep -v Warning | tee $OUT/ab_8192.log
