# CLI first tune: the probe process started with the build workers (new) against HEAD 22d3dc4
# (light traits only), in turns; a timeline of new; GPU tests of the CLI and NVRTC.
R=$PWD
rm -rf /tmp/oldfd && mkdir -p /tmp/oldfd && cp -r fastdlight /tmp/oldfd/ && cp .diag/run/cli_head.py /tmp/oldfd/fastdlight/cli.py && cp .diag/run/pool_head.py /tmp/oldfd/fastdlight/tune/pool.py
mkdir -p $OUT/logs
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
side_dir() { if [ $1 = old ]; then echo /tmp/oldfd; else echo $R; fi; }
for side in new old; do (cd $(side_dir $side) && PYTHONPATH=/tmp/site:$(side_dir $side) python -c "import fastdlight.tune.pool as n; print('$side', n.__file__, hasattr(n, 'gpu_device_nodes'), n.gpu_device_nodes() if hasattr(n, 'gpu_device_nodes') else '')"); done
PYTHONPATH=/tmp/site python -c "import tvm"
for i in 1 2 3 4 5; do
  for side in $( [ $((i % 2)) = 0 ] && echo "old new" || echo "new old"); do
    D=$(side_dir $side)
    (cd $D && PYTHONPATH=/tmp/site:$D python -m fastdlight.cli tune matmul 4096 4096 4096 --dtype float16 > $OUT/logs/cli_${side}_$i.log 2>&1)
    echo "$side run $i: $(grep -h 'Tuning wall' $OUT/logs/cli_${side}_$i.log); $(grep -h 'Winner' $OUT/logs/cli_${side}_$i.log | cut -c1-140)"
  done
done
PYTHONPATH=/tmp/site:$R TIMELINE=$OUT/logs/timeline_new.txt python .diag/cli_timeline.py > $OUT/logs/cli_timeline_new.log 2>&1
echo "timeline new: $(grep -h 'Tuning wall' $OUT/logs/cli_timeline_new.log)"; grep -v "build wait\|build start\|worker\|imap_unordered 1 " $OUT/logs/timeline_new.txt
grep "worker" $OUT/logs/timeline_new.txt | awk '{print $1, $3, $4}' | tr '\n' ';'; echo
grep "build start" $OUT/logs/timeline_new.txt | sort -k3 -n | awk '{print $3, $5, $9, $NF}' | tr '\n' ';'; echo
PYTHONPATH=/tmp/site:$R timeout 300 python -m pytest -q -m gpu -n 8 -p no:cacheprovider tests/tune tests/test_cli.py > $OUT/logs/pytest_gpu.log 2>&1; tail -3 $OUT/logs/pytest_gpu.log
PYTHONPATH=/tmp/site:$R timeout 300 python -m pytest -q tests/tune/test_nvrtc.py tests/test_cli.py -k "nvrtc or light or probe" -p no:cacheprovider > $OUT/logs/pytest_nvrtc.log 2>&1; tail -3 $OUT/logs/pytest_nvrtc.log
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $OUT/logs
