# GPU tests of the tuner and the mma.sync template; CLI tunes that build int8 and bf16 mma.sync
# candidates in the workers; the CLI's first tune, old (HEAD) against new with 16 and 14 workers.
R=$PWD
mkdir -p $OUT/logs
nvidia-smi --query-gpu=name --format=csv,noheader
PYTHONPATH=/tmp/site:$R python -c "import tvm"
timeout 240 python -m pytest -q -m gpu -n 8 -p no:cacheprovider tests/tune tests/schedules/test_matmul_tensorcore_gpu.py tests/test_cli.py > $OUT/logs/pytest_gpu.log 2>&1; echo "pytest rc=$?"; tail -3 $OUT/logs/pytest_gpu.log
for spec in "matmul 2048 2048 2048 --dtype int8" "matmul 2048 2048 2048 --dtype bfloat16 --layout NT"; do
  n=$(echo $spec | tr ' ' '_' | tr -d '-')
  python -m fastdlight.cli tune $spec > $OUT/logs/cli_$n.log 2>&1; echo "cli $spec rc=$?"
  grep -c "matmul_tc" $OUT/logs/cli_$n.log; grep -h "Winner\|Tuning wall\|failed" $OUT/logs/cli_$n.log | cut -c1-200
done
SIDES="old new16 new14"
for i in 1 2 3; do
  set -- $SIDES; [ $((i % 2)) = 0 ] && SIDES_I="$3 $2 $1" || SIDES_I="$1 $2 $3"
  for side in $SIDES_I; do
    W=""
    case $side in old) PP=/tmp/site:$R/.diag/oldfd;; new16) PP=/tmp/site:$R;; new14) PP=/tmp/site:$R; W="--workers 14";; esac
    t0=$(date +%s.%N)
    PYTHONPATH=$PP python -m fastdlight.cli tune matmul 4096 4096 4096 --dtype float16 $W > $OUT/logs/cli_${side}_$i.log 2>&1
    t1=$(date +%s.%N)
    echo "$side run $i: $(python -c "print(round($t1 - $t0, 2))") s; $(grep -h 'Tuning wall' $OUT/logs/cli_${side}_$i.log); $(grep -h 'Winner' $OUT/logs/cli_${side}_$i.log | cut -c1-150)"
  done
done
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $OUT/logs
