"""A model tuned end to end through a TVM tracker and two fastdlight RPC servers on this machine,
one per GPU (both on GPU 0 where there is one): every function measured remotely, the tuned
model computing what stock Dlight's build does."""

import os
import time

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

import fastdlight
import fastdlight.relax
from fastdlight.arch import auto_arch
from test_remote import free_port, start


@I.ir_module
class Small:
    @R.function
    def main(x: R.Tensor((256, 512), "float16"), w: R.Tensor((512, 1024), "float16")):
        with R.dataflow():
            y = R.nn.gelu(R.matmul(x, w))
            s = R.sum(y, axis=[1])
            R.output(s)
        return s


@pytest.mark.gpu
def test_gpu_a_model_tunes_through_a_tracker_and_two_servers(tmp_path):
    pytest.importorskip("tornado")
    gpus = ["0", "1"] if tvm.cuda(1).exist else ["0", "0"]
    tracker_port = free_port()
    tracker = start(["-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port", str(tracker_port),
                     "--port-end", str(tracker_port + 1)], f"bind to 127.0.0.1:{tracker_port}")
    servers = []
    try:
        for gpu in gpus:
            servers.append(start(["-m", "fastdlight.rpc_server", "--host", "127.0.0.1", "--port", str(free_port()),
                                  "--tracker", f"127.0.0.1:{tracker_port}", "--key", "gpu"], "fastdlight RPC server",
                                 env={**os.environ, "CUDA_VISIBLE_DEVICES": gpu}))
        time.sleep(1.0)  # the registrations reach the tracker
        arch = auto_arch()
        prepared = fastdlight.relax.prepare(arch.target)(Small)
        tuning = fastdlight.ApplyFastTuning(topk=4, target=arch, rpc=f"127.0.0.1:{tracker_port}:gpu",
                                            meta_database_dir=tmp_path)
        tuned = tuning(prepared)
        assert all(e.status == "tuned" and e.latency_ms and e.verified for e in tuning.report if e.status != "view")
        dev = tvm.cuda(0)
        rng = np.random.default_rng(0)
        args = [tvm.runtime.tensor(rng.uniform(-0.1, 0.1, s).astype("float16"), dev) for s in ((256, 512), (512, 1024))]
        ours = relax.VirtualMachine(fastdlight.build(tuned, arch.target), dev)["main"](*args).numpy()
        stock = relax.VirtualMachine(fastdlight.build(prepared, arch.target), dev)["main"](*args).numpy()
        np.testing.assert_allclose(ours.astype("float32"), stock.astype("float32"), rtol=2e-2, atol=2e-2)
    finally:
        for proc in servers + [tracker]:
            proc.kill()
            print(f"--- {proc.args[2:4]}:", "".join(proc.lines)[-3000:])  # shown if the test fails
