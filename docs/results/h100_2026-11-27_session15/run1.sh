# Lazy tensor intrinsics (new, working tree) against HEAD (old, .diag/oldfd): the CLI's first
# tune in turns, the benchmark's first tune (first2.py) and the CLI's timeline, each side.
R=$PWD
mkdir -p $OUT/logs
nvidia-smi --query-gpu=name --format=csv,noheader
PYTHONPATH=/tmp/site:$R python -c "import tvm" 
for i in ${RUNS:-1 2 3 4}; do
  for side in $( [ $((i % 2)) = 0 ] && echo "old new" || echo "new old"); do
    if [ $side = old ]; then PP=/tmp/site:$R/.diag/oldfd; else PP=/tmp/site:$R; fi
    t0=$(date +%s.%N)
    PYTHONPATH=$PP python -m fastdlight.cli tune matmul 4096 4096 4096 --dtype float16 > $OUT/logs/cli_${side}_$i.log 2>&1
    t1=$(date +%s.%N)
    echo "$side cli run $i: $(python -c "print(round($t1 - $t0, 2))") s; $(grep -h 'Tuning wall' $OUT/logs/cli_${side}_$i.log); $(grep -h 'Winner' $OUT/logs/cli_${side}_$i.log | cut -c1-140)"
    grep -h "failed\|Error\|error" $OUT/logs/cli_${side}_$i.log | head -3
  done
done
for side in new old; do
  if [ $side = old ]; then PP=/tmp/site:$R/.diag/oldfd; else PP=/tmp/site:$R; fi
  PYTHONPATH=$PP TIMELINE=$OUT/logs/timeline_$side.txt python .diag/cli_timeline.py > $OUT/logs/cli_timeline_$side.log 2>&1
  echo "$side timeline cli: $(grep -h 'Tuning wall' $OUT/logs/cli_timeline_$side.log)"; head -4 $OUT/logs/timeline_$side.txt
  PYTHONPATH=$PP python .diag/first2.py > $OUT/logs/first2_$side.log 2>&1
  echo "$side first2:"; grep -h "^(4096\|^imports" $OUT/logs/first2_$side.log | cut -c1-100
done
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $OUT/logs
