# CLI first tune: light traits (new) against HEAD (old), in turns; timelines of both.
R=$PWD
rm -rf /tmp/oldfd && mkdir -p /tmp/oldfd && cp -r fastdlight /tmp/oldfd/ && cp .diag/run/nvrtc_old.py /tmp/oldfd/fastdlight/tune/nvrtc.py
mkdir -p $OUT/logs
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
nproc
side_dir() { if [ $1 = old ]; then echo /tmp/oldfd; else echo $R; fi; }
for side in new old; do (cd $(side_dir $side) && PYTHONPATH=/tmp/site:$(side_dir $side) python -c "import fastdlight.tune.nvrtc as n; print('$side', n.__file__, hasattr(n, 'LIGHT_TRAITS'))"); done
PYTHONPATH=/tmp/site python -c "import tvm"
for i in 1 2 3 4; do
  for side in $( [ $((i % 2)) = 0 ] && echo "old new" || echo "new old"); do
    D=$(side_dir $side)
    (cd $D && PYTHONPATH=/tmp/site:$D python -m fastdlight.cli tune matmul 4096 4096 4096 --dtype float16 > $OUT/logs/cli_${side}_$i.log 2>&1)
    echo "$side run $i: $(grep -h 'Tuning wall' $OUT/logs/cli_${side}_$i.log); $(grep -h 'Winner' $OUT/logs/cli_${side}_$i.log | cut -c1-140)"
  done
done
for side in new old; do
  D=$(side_dir $side)
  PYTHONPATH=/tmp/site:$D TIMELINE=$OUT/logs/timeline_$side.txt python .diag/cli_timeline.py > $OUT/logs/cli_timeline_$side.log 2>&1
  echo "timeline $side: $(grep -h 'Tuning wall' $OUT/logs/cli_timeline_$side.log)"; grep -v "build wait\|build start\|worker" $OUT/logs/timeline_$side.txt
  grep "worker" $OUT/logs/timeline_$side.txt | awk '{print $1, $3, $4}' | tr '\n' ';'; echo
  grep "build start" $OUT/logs/timeline_$side.txt | sort -k3 -n | awk '{print $3, $5, $9, $NF}' | tr '\n' ';'; echo
done
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $OUT/logs
