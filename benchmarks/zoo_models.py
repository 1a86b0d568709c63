"""Real models as users bring them: torchvision, timm and Hugging Face transformers, random
weights, through the documented import path.

    python benchmarks/zoo_models.py [--models resnet50,vit_b_16] [--target nvidia/nvidia-h100]

Each model: ``torch.export`` (fp32, eval) -> ``from_exported_program(keep_params_as_input=True)``
-> ``detach_params`` -> ``for_inference(mod, params, fp16_io=True)`` -> ``prepare(target)``; no
build, no tuning, no GPU. One row per model: how far it got, or the first line of the error and
the stage that raised it. :data:`MODELS` (name -> :class:`ZooModel`) is the model list a zoo
benchmark builds from; torch and the model libraries are imported only when a model is built.
"""

from __future__ import annotations

import argparse
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

#: images and token sequences of the survey
IMAGE = (1, 3, 224, 224)
TOKENS = (1, 128)
#: the sizes a zoo benchmark runs (``"B"``: batch B; ``"BxS"``: batch B of S tokens), quickest first
VISION_SIZES = ("1", "16")
TEXT_SIZES = ("1x512", "4x2048")


@dataclass(frozen=True)
class ZooModel:
    """A model's builder (-> an ``nn.Module`` in eval mode, random weights) and its example
    inputs as ``(shape, dtype)`` (``"int64"`` inputs are token ids below :attr:`vocab`).
    :attr:`sizes`: the sizes people run it at, quickest first (see :meth:`inputs_at`)."""

    family: str
    build: Callable
    inputs: tuple
    vocab: int = 1000
    sizes: tuple = VISION_SIZES

    def inputs_at(self, size: str | None = None) -> tuple:
        """:attr:`inputs` at ``size``: ``"16"`` sets the batch, ``"4x2048"`` the batch and the
        sequence length (the leading dimensions of every input); None: as listed."""
        if size is None:
            return self.inputs
        lead = tuple(int(v) for v in size.split("x"))
        return tuple((lead + tuple(shape[len(lead):]), dtype) for shape, dtype in self.inputs)

    def example_inputs(self, seed: int = 0, size: str | None = None) -> tuple:
        import torch

        gen = torch.Generator().manual_seed(seed)
        out = []
        for shape, dtype in self.inputs_at(size):
            if dtype == "int64":
                out.append(torch.randint(0, self.vocab, shape, generator=gen, dtype=torch.int64))
            else:
                out.append(torch.randn(shape, generator=gen, dtype=getattr(torch, dtype)))
        return tuple(out)


def _torchvision(name: str) -> Callable:
    def build():
        import torchvision

        return getattr(torchvision.models, name)(weights=None).eval()

    return build


def _timm(name: str) -> Callable:
    def build():
        import timm

        return timm.create_model(name, pretrained=False).eval()

    return build


def _last_hidden_state(model):
    """``model`` returning its last hidden state alone (a tensor, not a ``ModelOutput``)."""
    import torch

    class LastHiddenState(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, x):
            return self.model(x, return_dict=False)[0]

    return LastHiddenState().eval()


def _hf(config_name: str, model_name: str, **config) -> Callable:
    def build():
        import transformers

        cfg = getattr(transformers, config_name)(**config)
        return _last_hidden_state(getattr(transformers, model_name)(cfg))

    return build


def _whisper_encoder():
    import transformers

    cfg = transformers.WhisperConfig(d_model=256, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=1024,
                                     decoder_layers=2, decoder_attention_heads=4, decoder_ffn_dim=1024,
                                     num_mel_bins=80, max_source_positions=64)
    return _last_hidden_state(transformers.WhisperModel(cfg).get_encoder())


# use_cache=False: with a cache, the first forward concatenates each layer's keys to an empty 1-D
# tensor (``torch.cat`` allows that), which TVM's importer rejects (concat of ndim 1 and 4)
_SMALL_LM = {"vocab_size": 1000, "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 2,
             "num_attention_heads": 8, "num_key_value_heads": 2, "max_position_embeddings": 2048, "use_cache": False}

MODELS: dict[str, ZooModel] = {
    **{name: ZooModel("torchvision", _torchvision(name), ((IMAGE, "float32"),))
       for name in ("resnet50", "mobilenet_v2", "mobilenet_v3_large", "efficientnet_b0", "convnext_tiny",
                    "regnet_y_800mf", "vit_b_16", "swin_t", "shufflenet_v2_x1_0")},
    **{f"timm_{name}": ZooModel("timm", _timm(name), ((IMAGE, "float32"),))
       for name in ("resnet18", "deit_tiny_patch16_224", "convnextv2_atto", "efficientvit_b0")},
    # positions up to 2048: TEXT_SIZES' longest sequence
    "gpt2_2l": ZooModel("transformers", _hf("GPT2Config", "GPT2Model", n_layer=2, vocab_size=1000, bos_token_id=0,
                                            eos_token_id=0, use_cache=False, n_positions=2048),
                        ((TOKENS, "int64"),), sizes=TEXT_SIZES),
    "llama_gqa_2l": ZooModel("transformers", _hf("LlamaConfig", "LlamaModel", **_SMALL_LM), ((TOKENS, "int64"),),
                             sizes=TEXT_SIZES),
    "qwen2_gqa_2l": ZooModel("transformers", _hf("Qwen2Config", "Qwen2Model", **_SMALL_LM), ((TOKENS, "int64"),),
                             sizes=TEXT_SIZES),
    "mistral_gqa_2l": ZooModel("transformers", _hf("MistralConfig", "MistralModel", **_SMALL_LM, sliding_window=None),
                               ((TOKENS, "int64"),), sizes=TEXT_SIZES),
    "bert_base_2l": ZooModel("transformers", _hf("BertConfig", "BertModel", num_hidden_layers=2, vocab_size=1000,
                                                 max_position_embeddings=2048),
                             ((TOKENS, "int64"),), sizes=TEXT_SIZES),
    "t5_encoder_small": ZooModel("transformers", _hf("T5Config", "T5EncoderModel", vocab_size=1000, d_model=256,
                                                     d_kv=32, d_ff=1024, num_layers=2, num_heads=8),
                                 ((TOKENS, "int64"),), sizes=TEXT_SIZES),
    # 2 * max_source_positions frames of 80 mel bins
    "whisper_encoder_small": ZooModel("transformers", _whisper_encoder, (((1, 80, 128), "float32"),)),
}


def build(name: str):
    """:data:`MODELS` ``[name]`` as an ``nn.Module`` (fp32, eval, random weights seeded alike).
    Weight matrices a library initializes to zeros (torchvision's ViT head) get small random
    values: a zero output would match anything, and the row's error would say nothing."""
    import torch

    torch.manual_seed(0)
    model = MODELS[name].build()
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() >= 2 and not param.any():
                param.normal_(0.0, 0.02)
    calibrate_batch_norms(model, MODELS[name])
    return model


def calibrate_batch_norms(model, spec: ZooModel) -> None:
    """BatchNorm statistics of random inputs, as a trained model has them of its data. With the
    initial ones (mean 0, variance 1) a deep CNN's activations shrink layer by layer: MobileNetV2's
    logits come out near 1e-9, zero in fp16, and a zero output matches anything."""
    import torch

    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # a cumulative average over the calibration batches
    shapes = [(4, *x.shape[1:]) for x in spec.example_inputs()]
    model.train()
    with torch.no_grad():
        for _ in range(2):
            model(*[torch.randn(shape) for shape in shapes])
    model.eval()


def export(name: str, size: str | None = None, model=None):
    """:data:`MODELS` ``[name]`` (or ``model``, as :func:`build` gives it) as a ``torch.export``
    program at ``size`` (see :meth:`ZooModel.inputs_at`)."""
    import torch

    model = build(name) if model is None else model
    with torch.no_grad():
        return torch.export.export(model, MODELS[name].example_inputs(size=size))


def to_relax(program):
    """``(module, params)`` of an exported program: TVM's importer (after
    :func:`~fastdlight.torch_backend.graph.views_as_reshapes`), weights detached."""
    from tvm import relax
    from tvm.relax.frontend.torch import from_exported_program

    from fastdlight.torch_backend.graph import views_as_reshapes

    mod = from_exported_program(views_as_reshapes(program), keep_params_as_input=True)
    mod, params = relax.frontend.detach_params(mod)
    return mod, params.get("main", [])


def survey(name: str, target: str) -> dict:
    """How far ``name`` gets: ``{"model", "status", "stage", "reason", "seconds"}``."""
    from fastdlight.relax import for_inference, prepare

    start, stage = time.perf_counter(), "torch.export"
    row = {"model": name, "status": "ok", "stage": "", "reason": ""}
    try:
        program = export(name)
        stage = "import"
        mod, params = to_relax(program)
        stage = "for_inference"
        mod = for_inference(mod, params, fp16_io=True)
        stage = "prepare"
        prepare(target)(mod)
    except Exception as e:  # noqa: BLE001 - a survey row, not a crash
        lines = [line for line in str(e).splitlines() if line.strip()]
        row.update(status="failed", stage=stage, reason=f"{type(e).__name__}: {lines[-1] if lines else ''}"[:300],
                   where=traceback.extract_tb(e.__traceback__)[-1].filename)
    row["seconds"] = round(time.perf_counter() - start, 1)
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated names (default: all)")
    parser.add_argument("--target", default="nvidia/nvidia-h100")
    args = parser.parse_args(argv)
    print("| model | status | stage | reason |\n|---|---|---|---|", flush=True)
    for name in args.models.split(","):
        row = survey(name, args.target)
        print(f"| {name} | {row['status']} ({row['seconds']} s) | {row['stage']} | {row['reason']} |", flush=True)


if __name__ == "__main__":
    main()
