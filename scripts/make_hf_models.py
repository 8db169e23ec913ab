"""Build published architectures with random weights to ONNX, offline, from transformers configs.

Usage: python scripts/make_hf_models.py --model {resnet50,mobilenetv2,vit-base,convnext-tiny,bert,bert-base,gpt2,<a family of FAMILIES>}
                                        [--batch N] [--seq-len N] [--layers N] [--out models/hf]

No weights or configs are downloaded: the configs are built in code and the weights are seeded random values,
which is all a latency measurement needs. Each file is checked with onnx.checker, ONNX Runtime and Collage's ONNX importer.
"""

import argparse
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from make_models import (
    SEED,
    MaskedLastHiddenState,
    build_and_check,
    check_onnx,
    export_onnx,
    make_bert,
    make_gpt2,
    randomize_norms_and_biases,
)
from torch import nn


class Logits(nn.Module):
    """Returns only the logits, so that the ONNX graph has one output."""

    def __init__(self, classifier: nn.Module):
        super().__init__()
        self.classifier = classifier

    def forward(self, pixel_values):
        return self.classifier(pixel_values=pixel_values).logits


def make_resnet50() -> nn.Module:
    from transformers import ResNetConfig, ResNetForImageClassification

    return Logits(ResNetForImageClassification(ResNetConfig(num_labels=1000)))


def make_mobilenetv2() -> nn.Module:
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification

    # TensorFlow-style "same" padding exports as Pad ops whose pads are computed in the graph (Slice/Concat/Cast),
    # which TVM's importer rejects as dynamic pads; symmetric padding, as in torchvision, gives the same shapes.
    config = MobileNetV2Config(num_labels=1000, tf_padding=False)
    return Logits(MobileNetV2ForImageClassification(config))


def make_vit_base() -> nn.Module:
    from transformers import ViTConfig, ViTForImageClassification

    return Logits(ViTForImageClassification(ViTConfig(num_labels=1000)))  # ViT-B/16 at 224x224


def make_convnext_tiny() -> nn.Module:
    from transformers import ConvNextConfig, ConvNextForImageClassification

    config = ConvNextConfig(num_labels=1000, depths=[3, 3, 9, 3], hidden_sizes=[96, 192, 384, 768])
    return Logits(ConvNextForImageClassification(config))


IMAGE_MODELS = {"resnet50": make_resnet50, "mobilenetv2": make_mobilenetv2, "vit-base": make_vit_base, "convnext-tiny": make_convnext_tiny}


class OneOutput(nn.Module):
    """One field of a transformers model's output for one input, so that the ONNX graph has one input and one output.

    Text models get an all-ones attention mask of the export's static shape (a constant), as ``TokenLogits`` explains.
    """

    def __init__(self, model: nn.Module, input_name: str, field: str, mask: bool = False):
        super().__init__()
        self.model, self.input_name, self.field, self.mask = model, input_name, field, mask

    def forward(self, inputs):
        extra = {}
        if self.mask:
            extra["attention_mask"] = torch.ones([int(size) for size in inputs.shape], dtype=torch.int64, device=inputs.device)
        return getattr(self.model(**{self.input_name: inputs}, **extra), self.field)


def _image(config_name: str, model_name: str, field: str = "logits", **config):
    def make():
        import transformers

        config.setdefault("num_labels", 1000)
        model = getattr(transformers, model_name)(getattr(transformers, config_name)(**config))
        return OneOutput(model, "pixel_values", field)

    return make


def _text(config_name: str, model_name: str, field: str, **config):
    def make():
        import transformers

        config.setdefault("attn_implementation", "eager")
        model = getattr(transformers, model_name)(getattr(transformers, config_name)(**config))
        return OneOutput(model, "input_ids", field, mask=True)

    return make


def _audio(config_name: str, model_name: str, field: str = "last_hidden_state", encoder: bool = False, **config):
    def make():
        import transformers

        model = getattr(transformers, model_name)(getattr(transformers, config_name)(**config))
        return OneOutput(model.get_encoder() if encoder else model, "input_features" if encoder else "input_values", field)

    return make


# Published full-size configurations of families beyond the six above (benchmarks/coverage.py's families), each
# named for the checkpoint whose config it repeats; random weights. The input of each: (shape, dtype).
FAMILIES = {
    "efficientnet-b0": (
        _image(
            "EfficientNetConfig",
            "EfficientNetForImageClassification",
            width_coefficient=1.0,
            depth_coefficient=1.0,
            image_size=224,
            dropout_rate=0.2,
            hidden_dim=1280,
        ),
        (3, 224, 224),
    ),
    "regnet-y-040": (_image("RegNetConfig", "RegNetForImageClassification"), (3, 224, 224)),
    "mobilevit-small": (_image("MobileViTConfig", "MobileViTForImageClassification"), (3, 256, 256)),
    "deit-small": (
        _image("DeiTConfig", "DeiTForImageClassification", hidden_size=384, num_attention_heads=6, intermediate_size=1536),
        (3, 224, 224),
    ),
    # dinov2-small's config says 518 pixels; at the 224 it is usually run at, with positions for 224.
    "dinov2-small": (
        _image("Dinov2Config", "Dinov2ForImageClassification", hidden_size=384, num_attention_heads=6, image_size=224),
        (3, 224, 224),
    ),
    "swin-tiny": (_image("SwinConfig", "SwinForImageClassification"), (3, 224, 224)),
    "pvt-tiny": (_image("PvtConfig", "PvtForImageClassification"), (3, 224, 224)),
    "segformer-b0": (_image("SegformerConfig", "SegformerForSemanticSegmentation", num_labels=150), (3, 512, 512)),
    "distilbert-base": (_text("DistilBertConfig", "DistilBertModel", "last_hidden_state"), (128,)),
    "deberta-v3-small": (
        _text(
            "DebertaV2Config",
            "DebertaV2Model",
            "last_hidden_state",
            hidden_size=768,
            num_hidden_layers=6,
            num_attention_heads=12,
            intermediate_size=3072,
            vocab_size=128100,
            max_relative_positions=-1,
            position_buckets=256,
            relative_attention=True,
            pos_att_type=["p2c", "c2p"],
            norm_rel_ebd="layer_norm",
            share_att_key=True,
            position_biased_input=False,
            type_vocab_size=0,
        ),
        (128,),
    ),
    "opt-125m": (_text("OPTConfig", "OPTForCausalLM", "logits"), (128,)),
    "wav2vec2-base": (_audio("Wav2Vec2Config", "Wav2Vec2Model"), (16000,)),
    "whisper-tiny-encoder": (
        _audio(
            "WhisperConfig",
            "WhisperModel",
            encoder=True,
            d_model=384,
            encoder_layers=4,
            encoder_attention_heads=6,
            encoder_ffn_dim=1536,
            decoder_layers=4,
            decoder_attention_heads=6,
            decoder_ffn_dim=1536,
            num_mel_bins=80,
        ),
        (80, 3000),
    ),
}
MODELS = [*IMAGE_MODELS, "bert", "bert-base", "gpt2", *FAMILIES]
AUDIO = ("wav2vec2-base", "whisper-tiny-encoder")


def file_stem(name: str, batch: int, seq_len: int = 128, layers: int | None = None) -> str:
    """The file name (without .onnx) ``build`` writes for these settings."""
    if name in IMAGE_MODELS:
        return f"{name.replace('-', '_')}_b{batch}" if name not in ("resnet50", "mobilenetv2") else f"{name}_b{batch}"
    if name == "gpt2":
        return f"gpt2_b{batch}_s{seq_len}"
    if name in FAMILIES:
        return f"{name.replace('-', '_')}_b{batch}"
    return f"bert_l{layers or (12 if name == 'bert-base' else 4)}_b{batch}_s{seq_len}"


def module_and_input(name: str, batch: int, seq_len: int = 128, layers: int | None = None):
    """The seeded PyTorch module (eval mode, random norms and biases), an example input and its name."""
    torch.manual_seed(SEED)
    if name in IMAGE_MODELS:
        model, example, input_name = IMAGE_MODELS[name](), torch.randn(batch, 3, 224, 224), "pixel_values"
    elif name in FAMILIES:
        make, shape = FAMILIES[name]
        model = make()
        if len(shape) == 1 and name not in AUDIO:  # token ids
            vocab = model.model.config.vocab_size
            example, input_name = torch.randint(0, vocab, (batch, *shape), dtype=torch.int64), "input_ids"
        else:
            example = torch.randn(batch, *shape)
            input_name = "pixel_values" if len(shape) == 3 else "input_features" if len(shape) == 2 else "input_values"
    elif name == "gpt2":
        model = make_gpt2()  # GPT-2 small: 12 layers, 768 wide
        example = torch.randint(0, model.model.config.vocab_size, (batch, seq_len), dtype=torch.int64)
        input_name = "input_ids"
    else:
        model = make_bert(hidden=768, heads=12, intermediate=3072, layers=layers or (12 if name == "bert-base" else 4))
        example = torch.randint(0, model.encoder.config.vocab_size, (batch, seq_len), dtype=torch.int64)
        input_name = "input_ids"
    randomize_norms_and_biases(model)
    return model.eval(), example, input_name


def build(name: str, batch: int, seq_len: int, layers: int | None, out: Path) -> dict:
    model, example_input, input_name = module_and_input(name, batch, seq_len, layers)
    return build_and_check(model, example_input, input_name, out / f"{file_stem(name, batch, seq_len, layers)}.onnx")


def build_dynamic(name: str, batch: int, seq_len: int, layers: int | None, out: Path) -> dict:
    """For ``--shapes``: BERT taking token ids and an attention mask of a symbolic batch and sequence, checked at
    ``batch`` x ``seq_len`` (``bert_l{layers}_dynamic.onnx``), or an image model of a symbolic batch, checked at
    ``batch`` (``{name}_dynamic.onnx``)."""
    model, example, input_name = module_and_input(name, batch, seq_len, layers)
    if name in IMAGE_MODELS:
        with torch.no_grad():
            reference = model(example).numpy()
        path = out / f"{name.replace('-', '_')}_dynamic.onnx"
        axes = {input_name: {0: "batch"}, "output": {0: "batch"}}
        return check_onnx(
            path, export_onnx(model, (example,), [input_name], path, dynamic_axes=axes), {input_name: example.numpy()}, reference
        )
    masked = MaskedLastHiddenState(model.encoder).eval()
    mask = torch.ones_like(example)
    with torch.no_grad():
        reference = masked(example, mask).numpy()
    names = ["input_ids", "attention_mask"]
    axes = {input_name: {0: "batch", 1: "sequence"} for input_name in [*names, "output"]}
    path = out / f"bert_l{layers or (12 if name == 'bert-base' else 4)}_dynamic.onnx"
    feeds = {"input_ids": example.numpy(), "attention_mask": mask.numpy()}
    return check_onnx(path, export_onnx(masked, (example, mask), names, path, dynamic_axes=axes), feeds, reference)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, choices=MODELS)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq-len", type=int, default=128, help="BERT and GPT-2")
    parser.add_argument("--layers", type=int, default=None, help="BERT only; default 4 for bert, 12 for bert-base")
    parser.add_argument("--out", type=Path, default=Path("models/hf"))
    parser.add_argument(
        "--dynamic",
        action="store_true",
        help="for --shapes: BERT with an attention mask input too, batch and sequence symbolic (bert_l{layers}_dynamic.onnx); "
        "an image model with its batch symbolic (NAME_dynamic.onnx)",
    )
    args = parser.parse_args()
    if args.dynamic:
        if args.model not in ("bert", "bert-base", *IMAGE_MODELS):
            parser.error(f"--dynamic is for --model bert, bert-base or an image model ({', '.join(IMAGE_MODELS)})")
        build_dynamic(args.model, args.batch, args.seq_len, args.layers, args.out)
    else:
        build(args.model, args.batch, args.seq_len, args.layers, args.out)


if __name__ == "__main__":
    main()
