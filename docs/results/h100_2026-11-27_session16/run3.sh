# Final code (new) against the session's start eb0f4a4 (old): the CLI's first tune in turns;
# then bench_gemm_hopper on the 4096³ cases (its first tune, the ratios).
R=$PWD
rm -rf /tmp/oldfd && mkdir -p /tmp/oldfd && tar xzf .diag/run/old_fd.tgz -C /tmp/oldfd
mkdir -p $OUT/logs
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
side_dir() { if [ $1 = old ]; then echo /tmp/oldfd; else echo $R; fi; }
for side in new old; do (cd $(side_dir $side) && PYTHONPATH=/tmp/site:$(side_dir $side) python -c "import fastdlight.tune.pool as n, fastdlight.tune.nvrtc as v; print('$side', n.__file__, hasattr(n, 'gpu_device_nodes'), hasattr(v, 'LIGHT_TRAITS'))"); done
PYTHONPATH=/tmp/site python -c "import tvm"
for i in 1 2 3 4; do
  for side in $( [ $((i % 2)) = 0 ] && echo "old new" || echo "new old"); do
    D=$(side_dir $side)
    (cd $D && PYTHONPATH=/tmp/site:$D python -m fastdlight.cli tune matmul 4096 4096 4096 --dtype float16 > $OUT/logs/cli_${side}_$i.log 2>&1)
    echo "$side run $i: $(grep -h 'Tuning wall' $OUT/logs/cli_${side}_$i.log); $(grep -h 'Winner' $OUT/logs/cli_${side}_$i.log | cut -c1-140)"
  done
done
PYTHONPATH=/tmp/site:$R TIMELINE=$OUT/logs/timeline_new.txt python .diag/cli_timeline.py > $OUT/logs/cli_timeline_new.log 2>&1
echo "timeline new: $(grep -h 'Tuning wall' $OUT/logs/cli_timeline_new.log)"; grep -v "build wait\|build start\|worker\|imap_unordered 1 " $OUT/logs/timeline_new.txt
PYTHONPATH=/tmp/site:$R timeout 420 python benchmarks/bench_gemm_hopper.py --only 4096³ > $OUT/logs/gemm_4096.log 2>&1; echo "bench rc=$?"
cat $OUT/bench_gemm_hopper.md 2>/dev/null | tail -5
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $OUT/logs
