python .diag/r18/trace.py (here trace_diag.py) --only order > $OUT/trace.log 2> $OUT/trace.err; echo "rc=$?"
tail -3 $OUT/trace.err
python .diag/r18/trace_report.py $OUT/trace.log | tee $OUT/trace_report.txt | grep -v "wave 3"
python .diag/r18/ab_order.py --only 4096NN o2048 8192NN down4096 up2048 2>&1 | grep -v Warning | tee $OUT/ab.log
