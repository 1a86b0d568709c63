#!/usr/bin/env bash
# One batched GPU check (for the lent GPU machine): hardware model, GPU tests, CLI tuning wall
# time, tensor-core and operator benchmarks. Each step has its own time limit so one slow step
# cannot starve the rest; one log, $OUT/gpu_check.log (the device tool returns at most 8 files).
#   source .tvmpack/setup.sh && bash scripts/gpu_check.sh [steps...]   (default: arch tests cli tc ops)
# Further steps: bf16 (bf16 mma.sync correctness), models (bench_models, $MODELS), conv (bench_conv,
# layers matching $CONV_ONLY), sustained (bench_sustained: tiles cold and hot, clusters beside),
# attention (the fused template's GPU test, then bench_attention on $ATTENTION_CASES), zoo
# (bench_zoo on $ZOO_MODELS, each case under $ZOO_CASE_LIMIT seconds, $ZOO_JOBS cases at once, the
# cases finished in $ZOO_RESUME, an earlier call's bench_zoo.jsonl, kept), quant
# (the FP8 template's and the dequantizing GEMV's GPU tests, then bench_quant: FP8 against torch,
# 4- and 8-bit weights against our 16-bit kernels), rpc (a
# model tuned through a tracker and two local servers; a 4096³ fp16 GEMM tuned through a local
# fastdlight.rpc_server, then locally, to compare), devices
# (on a machine of several GPUs: the two-GPU test, then bench_devices on $DEVICES), decode
# (the split-KV decode attention's GPU test, paged and merged cases included; bench_decode_attention
# against torch SDPA, the merge a kernel of its own and then in the chunk step; bench_decode_step: a LLaMA-3-8B layer's decode step at $DECODE_LENGTHS), backend
# (bench_torch_backend on $BACKEND_MODELS; $BACKEND_NO_SECOND leaves out the second process), softmax
# (the float64 reference's GPU tests, then the CLI's tune of a 4096x32000 softmax: its wall time).
set -uo pipefail
out=${OUT:-gpu_check_out}; mkdir -p "$out"
export PYTHONUNBUFFERED=1 TVM_CUDA_COMPILE_MODE=${TVM_CUDA_COMPILE_MODE:-nvcc}
steps=${*:-arch tests cli tc ops}
step() { local name=$1 limit=$2; shift 2; echo "=== $name (limit ${limit}s) ==="; local t0=$SECONDS
  timeout "$limit" "$@" 2>&1 | tee -a "$out/gpu_check.log"; echo "=== $name: rc=${PIPESTATUS[0]} in $((SECONDS - t0)) s ==="; }
for s in $steps; do case $s in
  arch)  step arch 60 python3 -c "import tvm; from fastdlight.arch import CUDA; print(CUDA.from_device(tvm.cuda(0)))";;
  tests) step tests "${TESTS_LIMIT:-200}" python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider tests;;
  cli)   step cli 90 python3 -m fastdlight.cli tune matmul 4096 4096 4096 --dtype float32 --topk 20;;
  tc)    step tc "${TC_LIMIT:-170}" python3 benchmarks/bench_matmul_tc.py --topk 20;;
  ops)   step ops "${OPS_LIMIT:-170}" python3 benchmarks/bench_ops.py --topk 20 --max-seconds $(( ${OPS_LIMIT:-170} - 20 )) \
           --ops "${OPS_FILTER:-copy,add,sum,max,softmax,gemv,matmul_nn_f32_4k,matmul_nn_f32_1k,matmul_nn_f16_8k,conv2d}";;
  softmax) step reference-test 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/measure/test_widen.py
           step softmax-tune 90 python3 -m fastdlight.cli tune softmax 4096 32000 --dtype float16;;
  bf16)   step bf16 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/schedules/test_matmul_tensorcore_gpu.py -k bf16;;
  models) step models "${MODELS_LIMIT:-400}" python3 benchmarks/bench_models.py --models "${MODELS:-decoder_ln,llama_b1_s512}" \
            --profile --out "$out/models";;
  sustained) step sustained "${SUSTAINED_LIMIT:-300}" python3 benchmarks/bench_sustained.py;;
  attention) step attention-test 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/schedules/test_attention_wgmma_gpu.py
             step attention "${ATTENTION_LIMIT:-300}" python3 benchmarks/bench_attention.py --topk 4 \
               --cases "${ATTENTION_CASES:-prefill_causal_4k,prefill_causal_4k_bf16,prefill_8k,prefill_causal_gpt2,prefill_gqa_2k,prefill_causal_b4_2k,prefill_tail_4097,decode_b1,decode_b16}";;
  zoo)    step zoo "${ZOO_LIMIT:-560}" python3 benchmarks/bench_zoo.py --models "${ZOO_MODELS:-gpt2_2l,bert_base_2l}" \
            --time-limit "${ZOO_CASE_LIMIT:-130}" --jobs "${ZOO_JOBS:-1}" ${ZOO_RESUME:+--resume "$ZOO_RESUME"} \
            ${ZOO_TUNE_JOBS:+--tune-jobs "$ZOO_TUNE_JOBS"};;
  quant)  step quant-test 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/schedules/test_matmul_wgmma_gpu.py -k "fp8"
          step dequant-test 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/schedules/test_gemv_dequant_gpu.py
          step quant "${QUANT_LIMIT:-400}" python3 benchmarks/bench_quant.py --topk "${QUANT_TOPK:-8}";;
  rpc)    step rpc-model 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/search/test_remote_gpu.py
          python3 -m fastdlight.rpc_server --host 127.0.0.1 --port 9090 > "$out/rpc_server.log" 2>&1 & rpc_pid=$!
          sleep 10
          step rpc-tune 200 python3 -m fastdlight.cli tune matmul 4096 4096 4096 --dtype float16 --rpc 127.0.0.1:9090
          step local-tune 200 python3 -m fastdlight.cli tune matmul 4096 4096 4096 --dtype float16
          kill "$rpc_pid";;
  backend) step backend "${BACKEND_LIMIT:-400}" python3 benchmarks/bench_torch_backend.py \
            --models "${BACKEND_MODELS:-resnet50,bert_base_2l,llama_gqa_2l}" ${BACKEND_NO_SECOND:+--no-second};;
  decode) step decode-attention-test 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/schedules/test_decode_attention_gpu.py
          step decode-attention "${DECODE_ATTENTION_LIMIT:-250}" python3 benchmarks/bench_decode_attention.py
          cp "$out/bench_decode_attention.json" "$out/bench_decode_attention_pair.json" 2>/dev/null
          step decode-attention-merged "${DECODE_ATTENTION_LIMIT:-250}" python3 benchmarks/bench_decode_attention.py --merge step
          step decode "${DECODE_LIMIT:-500}" python3 benchmarks/bench_decode_step.py --lengths "${DECODE_LENGTHS:-512,2048,8192}";;
  devices) step devices-test 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/measure/test_gpu_turns.py
           step devices "${DEVICES_LIMIT:-500}" python3 benchmarks/bench_devices.py --devices "${DEVICES:-0,1}";;
  conv)   step conv "${CONV_LIMIT:-400}" python3 benchmarks/bench_conv.py --layouts NHWC NCHW --dtypes float16 bfloat16 \
            --only "${CONV_ONLY:-l1 3x3}";;
esac; done
