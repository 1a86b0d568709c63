"""Draw fastdlight's speedups per workload from the compact results in ``benchmarks/results/``.

    python benchmarks/plot_speedups.py [--results benchmarks/results] [--out docs/speedups.png]

Four panels, one bar per workload (> 1: fastdlight faster), each titled with its benchmark, GPU
and date as the JSON records them:

* GEMMs against cuBLAS (the newest ``gemm_hopper_*.json`` by its ``date`` field: the ratio at each
  side's own sustained clock, CUDA graphs for kernels under 50 µs);
* whole models against torch.compile and torch in a CUDA graph (``models_h100.json``);
* ResNet-18's convolution layers against cuDNN (``conv_h100.json``);
* memory-bound operators and CUDA-core fp32 GEMMs against torch (``ops_h100.json``; its fp16 GEMM
  and convolution rows predate the wgmma template and are left out).

Needs matplotlib (``pip install matplotlib``); nothing of fastdlight or TVM is imported.
"""

from __future__ import annotations

import argparse
import json
import pathlib

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent

#: what the model keys of bench_models stand for
MODEL_NAMES = {
    "llama_b1_s512": "LLaMA layer, 1×512 tokens",
    "llama_b4_s512": "LLaMA layer, 4×512 tokens",
    "decoder_ln": "LayerNorm decoder layer, 4×512",
    "mlp_gelu": "MLP 4096→11008→4096, GELU",
    "mlp_silu": "gated MLP, SiLU",
    "resnet18_nhwc_b16": "ResNet-18 NHWC, batch 16",
    "resnet18_nchw_b16": "ResNet-18 NCHW model, batch 16",
    "resnet18_nhwc_b1": "ResNet-18 NHWC, batch 1",
}


def load(results: pathlib.Path, name: str) -> dict:
    with open(results / name) as f:
        return json.load(f)


def short_device(device: str) -> str:
    return device.split(" (")[0].replace("NVIDIA ", "")


def newest(results: pathlib.Path, pattern: str) -> str:
    """The name of the newest file matching ``pattern`` by its ``date`` field (then by name)."""
    names = sorted(p.name for p in results.glob(pattern))
    if not names:
        raise FileNotFoundError(f"no {pattern} in {results}")
    return max(names, key=lambda name: (load(results, name).get("date", ""), name))


def gemm_panel(results: pathlib.Path):
    d = load(results, newest(results, "gemm_hopper_*.json"))
    table = d["tables"][0]
    rows = [(r["case"].replace("llama", "LLaMA"), r["ratio"]) for r in table["rows"]]
    title = f"GEMMs vs cuBLAS: {d['benchmark']}, {short_device(d['device'])}, {table.get('date', d['date'])}"
    return title, rows, None


def models_panel(results: pathlib.Path):
    d = load(results, "models_h100.json")
    rows = d["tables"][0]["rows"]
    dates = sorted({r["date"] for r in rows})
    title = (f"Models vs torch.compile (dark) and torch in a CUDA graph (light):\n"
             f"{d['benchmark']}, {short_device(d['device'])}, {' and '.join(dates)}")
    labels = [MODEL_NAMES.get(r["model"], r["model"]) for r in rows]
    return title, list(zip(labels, (r["vs_torch_compile"] for r in rows))), [r["vs_torch_graph"] for r in rows]


#: bench_ops rows the other panels supersede: its fp16 GEMMs and convolution ran on mma.sync and CUDA
#: cores, before the Hopper TMA + wgmma template took them over
SUPERSEDED = ("fp16 1024", "fp16 8192", "conv2d")


def ops_panel(results: pathlib.Path):
    d = load(results, "ops_h100.json")
    rows = [(r["desc"].replace(" (last axis)", ""), r["vs_torch"]) for r in d["rows"]
            if r["op"] != "copy" and not any(s in r["desc"] for s in SUPERSEDED)]
    title = (f"Memory-bound operators and fp32 GEMMs (CUDA cores) vs torch:\n"
             f"{d['benchmark']}, {short_device(d['device'])}, {d['date']}")
    return title, rows, None


def conv_panel(results: pathlib.Path):
    d = load(results, "conv_h100.json")
    table = d["tables"][0]
    rows = [(r["case"].replace(" NHWC float16 b16", ""), r["ratio"]) for r in table["rows"]]
    title = (f"ResNet-18 convolutions (NHWC fp16, batch 16) vs cuDNN:\n"
             f"{d['benchmark']}, {short_device(d['device'])}, {table.get('date', d['date'])}")
    return title, rows, None


def draw(panels, out: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    heights = [len(rows) + 2 for _, rows, _ in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 0.27 * sum(heights) + 1),
                             gridspec_kw={"height_ratios": heights})
    for ax, (title, rows, second) in zip(axes, panels):
        labels = [label for label, _ in rows]
        values = [v for _, v in rows]
        y = list(range(len(rows)))[::-1]
        width = 0.4 if second else 0.7
        offset = width / 2 if second else 0.0
        colors = ["#2b7bba" if v >= 1 else "#d95f02" for v in values]
        ax.barh([p + offset for p in y], [v - 1 for v in values], left=1, height=width, color=colors,
                label="vs torch.compile" if second else None)
        for p, v in zip(y, values):
            ax.text(max(v, 1) + 0.01, p + offset, f"{v:.2f}×", va="center", fontsize=7)
        if second:
            ax.barh([p - offset for p in y], [v - 1 for v in second], left=1, height=width, color="#9ecae1",
                    label="vs torch in a CUDA graph")
            for p, v in zip(y, second):
                ax.text(max(v, 1) + 0.01, p - offset, f"{v:.2f}×", va="center", fontsize=7, color="#555555")
            ax.legend(loc="upper right", fontsize=7, frameon=False)
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.set_yticks(y)
        ax.set_yticklabels(labels, fontsize=7.5)
        ax.set_title(title, fontsize=9, loc="left")
        hi = max(values + list(second or []))
        lo = min(values + list(second or []))
        ax.set_xlim(min(0.9, lo - 0.05), hi * 1.12)
        ax.tick_params(axis="x", labelsize=7.5)
        ax.grid(axis="x", linewidth=0.3, alpha=0.5)
    axes[-1].set_xlabel("speedup of fastdlight (× = other side's time / fastdlight's; > 1: fastdlight faster)",
                        fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default=str(HERE / "results"), help="folder of the compact JSON results")
    parser.add_argument("--out", default=str(ROOT / "docs" / "speedups.png"), help="PNG to write")
    args = parser.parse_args()
    results = pathlib.Path(args.results)
    draw([gemm_panel(results), models_panel(results), conv_panel(results), ops_panel(results)],
         pathlib.Path(args.out))


if __name__ == "__main__":
    main()
