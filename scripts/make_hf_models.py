"""Build published architectures with random weights to ONNX, offline, from transformers configs.

Usage: python scripts/make_hf_models.py --model {resnet50,bert,bert-base,mobilenetv2}
                                        [--batch N] [--seq-len N] [--layers N] [--out models/hf]

No weights or configs are downloaded: the configs are built in code and the weights are seeded random values,
which is all a latency measurement needs. Each file is checked with onnx.checker, ONNX Runtime and TVM's importer.
"""

import argparse
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from torch import nn

from make_models import SEED, build_and_check, make_bert, randomize_norms_and_biases


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


def build(name: str, batch: int, seq_len: int, layers: int | None, out: Path) -> dict:
    torch.manual_seed(SEED)
    if name in ("resnet50", "mobilenetv2"):
        model = make_resnet50() if name == "resnet50" else make_mobilenetv2()
        example_input, input_name, file_name = torch.randn(batch, 3, 224, 224), "pixel_values", f"{name}_b{batch}"
    else:
        layers = layers or (12 if name == "bert-base" else 4)
        model = make_bert(hidden=768, heads=12, intermediate=3072, layers=layers)
        example_input = torch.randint(0, model.encoder.config.vocab_size, (batch, seq_len), dtype=torch.int64)
        input_name, file_name = "input_ids", f"bert_l{layers}_b{batch}_s{seq_len}"
    randomize_norms_and_biases(model)
    return build_and_check(model, example_input, input_name, out / f"{file_name}.onnx")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, choices=["resnet50", "bert", "bert-base", "mobilenetv2"])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq-len", type=int, default=128, help="BERT only")
    parser.add_argument("--layers", type=int, default=None, help="BERT only; default 4 for bert, 12 for bert-base")
    parser.add_argument("--out", type=Path, default=Path("models/hf"))
    args = parser.parse_args()
    build(args.model, args.batch, args.seq_len, args.layers, args.out)


if __name__ == "__main__":
    main()
