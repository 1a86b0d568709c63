nvidia-smi --query-gpu=name,temperature.gpu,clocks.sm,power.draw --format=csv
python .diag/r18/trace.py (here trace_diag.py) > $OUT/trace.log 2> $OUT/trace.err; echo "rc=$?"
grep -v "^FDL" $OUT/trace.log | head; tail -3 $OUT/trace.err
python .diag/r18/trace_report.py $OUT/trace.log | tee $OUT/trace_report.txt
