nvidia-smi --query-gpu=name,temperature.gpu,clocks.sm,power.draw --format=csv
python .diag/r18/trace.py (here trace_diag.py) --only stage > $OUT/trace.log 2> $OUT/trace.err; echo "rc=$?"
tail -3 $OUT/trace.err
python .diag/r18/trace_report.py $OUT/trace.log | tee $OUT/trace_report.txt
python .diag/r18/ab_stage.py 2>&1 | grep -v Warning | tee $OUT/ab.log
