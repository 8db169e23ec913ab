"""Build published architectures with random weights to ONNX, offline, from transformers configs.

Usage: python scripts/make_hf_models.py --model {resnet50,mobilenetv2,vit-base,convnext-tiny,bert,bert-base,gpt2}
                                        [--batch N] [--seq-len N] [--layers N] [--out models/hf]

No weights or configs are downloaded: the configs are built in code and the weights are seeded random values,
which is all a latency measurement needs. Each file is checked with onnx.checker, ONNX Runtime and Collage's ONNX importer.
"""

import argparse
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from torch import nn

from make_models import SEED, build_and_check, make_bert, make_gpt2, randomize_norms_and_biases


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
MODELS = [*IMAGE_MODELS, "bert", "bert-base", "gpt2"]


def file_stem(name: str, batch: int, seq_len: int = 128, layers: int | None = None) -> str:
    """The file name (without .onnx) ``build`` writes for these settings."""
    if name in IMAGE_MODELS:
        return f"{name.replace('-', '_')}_b{batch}" if name not in ("resnet50", "mobilenetv2") else f"{name}_b{batch}"
    if name == "gpt2":
        return f"gpt2_b{batch}_s{seq_len}"
    return f"bert_l{layers or (12 if name == 'bert-base' else 4)}_b{batch}_s{seq_len}"


def module_and_input(name: str, batch: int, seq_len: int = 128, layers: int | None = None):
    """The seeded PyTorch module (eval mode, random norms and biases), an example input and its name."""
    torch.manual_seed(SEED)
    if name in IMAGE_MODELS:
        model, example, input_name = IMAGE_MODELS[name](), torch.randn(batch, 3, 224, 224), "pixel_values"
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, choices=MODELS)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq-len", type=int, default=128, help="BERT and GPT-2")
    parser.add_argument("--layers", type=int, default=None, help="BERT only; default 4 for bert, 12 for bert-base")
    parser.add_argument("--out", type=Path, default=Path("models/hf"))
    args = parser.parse_args()
    build(args.model, args.batch, args.seq_len, args.layers, args.out)


if __name__ == "__main__":
    main()
