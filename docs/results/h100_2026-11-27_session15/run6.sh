# The CLI first tune: build workers forked from a zygote (new) against fresh ones (HEAD), in turns.
R=$PWD
mkdir -p $OUT/logs
nvidia-smi --query-gpu=name --format=csv,noheader
PYTHONPATH=/tmp/site:$R python -c "import tvm"
for i in 1 2 3 4; do
  for side in $( [ $((i % 2)) = 0 ] && echo "old new" || echo "new old"); do
    if [ $side = old ]; then PP=/tmp/site:$R/.diag/oldfd; else PP=/tmp/site:$R; fi
    t0=$(date +%s.%N)
    PYTHONPATH=$PP python -m fastdlight.cli tune matmul 4096 4096 4096 --dtype float16 > $OUT/logs/cli_${side}_$i.log 2>&1
    t1=$(date +%s.%N)
    echo "$side run $i: $(python -c "print(round($t1 - $t0, 2))") s; $(grep -h 'Tuning wall' $OUT/logs/cli_${side}_$i.log); $(grep -h 'Winner' $OUT/logs/cli_${side}_$i.log | cut -c1-150)"
  done
done
PYTHONPATH=/tmp/site:$R TIMELINE=$OUT/logs/timeline_new.txt python .diag/cli_timeline.py > $OUT/logs/cli_timeline_new.log 2>&1
echo "timeline: $(grep -h 'Tuning wall' $OUT/logs/cli_timeline_new.log)"; grep -v "build wait\|build start" $OUT/logs/timeline_new.txt
grep "build start" $OUT/logs/timeline_new.txt | sort -k3 -n | awk '{print $3, $5, $NF}' | tr '\n' ';'; echo
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $OUT/logs
