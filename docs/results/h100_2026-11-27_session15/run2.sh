# CLI first tune: old (HEAD) against new (working tree) with 16 (default), 12 and 8 build workers.
R=$PWD
mkdir -p $OUT/logs
nvidia-smi --query-gpu=name --format=csv,noheader
lscpu | grep -i "^CPU(s)\|Thread(s) per core\|Core(s) per socket\|Socket(s)\|Model name\|NUMA node(s)"
PYTHONPATH=/tmp/site:$R python -c "import tvm"
SIDES="old new16 new12 new8"
for i in 1 2 3; do
  set -- $SIDES; [ $((i % 2)) = 0 ] && SIDES_I="$4 $3 $2 $1" || SIDES_I="$1 $2 $3 $4"
  for side in $SIDES_I; do
    W=""
    case $side in old) PP=/tmp/site:$R/.diag/oldfd;; new16) PP=/tmp/site:$R;; new12) PP=/tmp/site:$R; W="--workers 12";; new8) PP=/tmp/site:$R; W="--workers 8";; esac
    t0=$(date +%s.%N)
    PYTHONPATH=$PP python -m fastdlight.cli tune matmul 4096 4096 4096 --dtype float16 $W > $OUT/logs/cli_${side}_$i.log 2>&1
    t1=$(date +%s.%N)
    echo "$side run $i: $(python -c "print(round($t1 - $t0, 2))") s; $(grep -h 'Tuning wall' $OUT/logs/cli_${side}_$i.log); $(grep -h 'Winner' $OUT/logs/cli_${side}_$i.log | cut -c1-150)"
  done
done
for side in new16 new8; do
  W=""; [ $side = new8 ] && W="--workers 8"
  PYTHONPATH=/tmp/site:$R TIMELINE=$OUT/logs/timeline_$side.txt python .diag/cli_timeline.py tune matmul 4096 4096 4096 --dtype float16 $W > $OUT/logs/cli_timeline_$side.log 2>&1
  echo "$side timeline: $(grep -h 'Tuning wall' $OUT/logs/cli_timeline_$side.log)"; grep -v "build wait\|build start" $OUT/logs/timeline_$side.txt
  grep "build start" $OUT/logs/timeline_$side.txt | sort -k3 -n | awk '{print $3, $5, $NF}' | tr '\n' ';'; echo
done
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $OUT/logs
