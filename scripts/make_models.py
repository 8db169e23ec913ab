"""Build the small ONNX models shipped with Collage into models/.

Usage: python scripts/make_models.py [--out models]

Weights are random but seeded, so the files are the same on every run.
make_hf_models.py reuses the export, check and model-building helpers defined here.
"""

import argparse
import collections
import os
import time
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

OPSET = 17
SEED = 0


def export_onnx(
    model: nn.Module, example_inputs: tuple, input_names: list[str], path: Path, dynamic_axes: dict | None = None
) -> onnx.ModelProto:
    """Export with the TorchScript exporter, everything in one file: static shapes, or symbolic the dimensions
    ``dynamic_axes`` names (``{input or "output": {axis: name}}``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    model.eval()
    # The dynamo exporter needs onnxscript, which the project does not depend on.
    warnings.filterwarnings("ignore", message="You are using the legacy TorchScript-based ONNX export")
    with torch.no_grad():
        torch.onnx.export(
            model,
            example_inputs,
            str(path),
            input_names=input_names,
            output_names=["output"],
            opset_version=OPSET,
            do_constant_folding=True,
            dynamic_axes=dynamic_axes,
            dynamo=False,
        )
    onnx_model = onnx.load(str(path))
    onnx.checker.check_model(onnx_model, full_check=True)
    return onnx_model


def ort_latency_ms(path: Path, feeds: dict[str, np.ndarray], runs: int = 10) -> tuple[list[np.ndarray], float]:
    """Run the model in ONNX Runtime on CPU; return its outputs and the median latency in milliseconds."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    outputs = session.run(None, feeds)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - start)
    return outputs, 1000 * float(np.median(times))


def tvm_import_error(onnx_model: onnx.ModelProto) -> str | None:
    """Import into Relax as Collage does (``load_model``: the model's shapes folded, then TVM's importer with
    Collage's fixes to its converters); return None on success, otherwise the reason it failed."""
    from collage_core.model.model_import import load_model

    try:
        load_model(onnx_model)
    except Exception as error:  # the frontend raises several types; report whichever it was
        return f"{type(error).__name__}: {error}".splitlines()[0]
    return None


def at_shapes_of(onnx_model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> onnx.ModelProto:
    """``onnx_model`` with its symbolic dimensions (if any) bound to the sizes of ``feeds``, as ``--shapes`` binds them."""
    from collage_core.model.shape_profiles import parse_shapes, static_onnx, symbolic_inputs

    inputs = symbolic_inputs(onnx_model)
    if all(isinstance(dim, int) for spec in inputs for dim in spec.dims):
        return onnx_model
    listed = " ".join(f"{name}={'x'.join(map(str, array.shape))}" for name, array in feeds.items())
    return static_onnx(onnx_model, parse_shapes(listed, inputs)[0])


def check_onnx(path: Path, onnx_model: onnx.ModelProto, feeds: dict[str, np.ndarray], reference: np.ndarray) -> dict:
    """Run the model in ONNX Runtime and TVM's importer, compare with PyTorch, and print a summary."""
    outputs, latency_ms = ort_latency_ms(path, feeds)
    max_abs_diff = float(np.max(np.abs(outputs[0] - reference)))
    tvm_error = tvm_import_error(at_shapes_of(onnx_model, feeds))
    op_histogram = collections.Counter(node.op_type for node in onnx_model.graph.node)
    size_mb = path.stat().st_size / 1e6
    print(f"{path}: {size_mb:.2f} MB, {len(onnx_model.graph.node)} nodes")
    print(f"  inputs: {[(i.name, feeds[i.name].shape, str(feeds[i.name].dtype)) for i in onnx_model.graph.input]}")
    print(f"  output shape {outputs[0].shape}, max |ORT - torch| = {max_abs_diff:.2e}")
    print(f"  ORT CPU median latency: {latency_ms:.2f} ms")
    print(f"  TVM relax import: {'ok' if tvm_error is None else 'FAILED: ' + tvm_error}")
    print(f"  ops: {dict(op_histogram.most_common())}")
    return {"size_mb": size_mb, "latency_ms": latency_ms, "tvm_error": tvm_error, "ops": op_histogram}


def conv_bn_relu(in_channels: int, out_channels: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(out_channels), nn.ReLU()
    )


class ResidualBlock(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.body = nn.Sequential(conv_bn_relu(channels, channels), conv_bn_relu(channels, channels))

    def forward(self, x):
        return torch.relu(x + self.body(x))


class TwoBranchBlock(nn.Module):
    """Two branches of different kernel sizes, concatenated along channels (an Inception-style join)."""

    def __init__(self, in_channels: int, branch_channels: int):
        super().__init__()
        self.branch_3x3 = conv_bn_relu(in_channels, branch_channels, stride=2)
        self.branch_1x1 = nn.Sequential(
            nn.Conv2d(in_channels, branch_channels, 1, stride=2, bias=False), nn.BatchNorm2d(branch_channels), nn.ReLU()
        )

    def forward(self, x):
        return torch.cat([self.branch_3x3(x), self.branch_1x1(x)], dim=1)


class TinyResNet(nn.Module):
    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            conv_bn_relu(3, 16), ResidualBlock(16), TwoBranchBlock(16, 16), ResidualBlock(32), TwoBranchBlock(32, 32), ResidualBlock(64)
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(64, num_classes)

    def forward(self, x):
        return self.classifier(torch.flatten(self.pool(self.features(x)), 1))


def randomize_norms_and_biases(model: nn.Module) -> None:
    """Replace the default zero biases and unit norm scales/statistics with seeded random values.

    With the defaults a dropped bias or a wrong normalisation lowering would not change the output,
    and the exporter would merge the identical initializers into Identity nodes.
    """
    with torch.no_grad():
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            if name.endswith("bias") or name.endswith("running_mean"):
                tensor.uniform_(-0.1, 0.1)
            elif tensor.dim() == 1 and (name.endswith("weight") or name.endswith("running_var")):
                tensor.uniform_(0.8, 1.2)


class LastHiddenState(nn.Module):
    """Wraps a transformers encoder so that the ONNX graph has input_ids as its sole input.

    Without an attention_mask every token attends to every other, so no mask-building ops end up in the graph.
    Token types and positions are passed explicitly: with static shapes they fold to constants, whereas the
    model's own defaults export as a chain of Expand/Where/GatherElements on its buffers.
    """

    def __init__(self, encoder: nn.Module):
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids):
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        outputs = self.encoder(input_ids=input_ids, token_type_ids=torch.zeros_like(input_ids), position_ids=positions)
        return outputs.last_hidden_state


class MaskedLastHiddenState(nn.Module):
    """An encoder's last hidden state for token ids and their attention mask, both of any batch and length:
    the mask is what lets a shorter sequence be padded (masked positions change nothing of the others)."""

    def __init__(self, encoder: nn.Module):
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids, attention_mask):
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        outputs = self.encoder(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=torch.zeros_like(input_ids), position_ids=positions
        )
        return outputs.last_hidden_state


def make_bert(hidden: int, heads: int, intermediate: int, layers: int, vocab: int = 30522) -> nn.Module:
    from transformers import BertConfig, BertModel

    config = BertConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_attention_heads=heads,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        attn_implementation="eager",
    )
    return LastHiddenState(BertModel(config, add_pooling_layer=False))


class TokenLogits(nn.Module):
    """A causal language model's logits for a batch of token ids (no cache, one output)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        # An all-ones mask of the export's static shape (a constant): without a mask, transformers
        # looks for packed sequences with torch.diff, which has no ONNX export; a mask computed from
        # the input leaves mask arithmetic that TVM's importer refuses.
        mask = torch.ones([int(size) for size in input_ids.shape], dtype=torch.int64, device=input_ids.device)
        return self.model(input_ids=input_ids, attention_mask=mask, use_cache=False).logits


def make_gpt2(embedding: int = 768, heads: int = 12, layers: int = 12, vocab: int = 50257, positions: int = 1024) -> nn.Module:
    """``GPT2LMHeadModel``'s logits; the defaults are GPT-2 small's."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        n_embd=embedding,
        n_head=heads,
        n_layer=layers,
        vocab_size=vocab,
        n_positions=positions,
        bos_token_id=vocab - 1,
        eos_token_id=vocab - 1,
    )
    return TokenLogits(GPT2LMHeadModel(config))


def build_and_check(model: nn.Module, example_input: torch.Tensor, input_name: str, path: Path) -> dict:
    with torch.no_grad():
        reference = model.eval()(example_input).numpy()
    onnx_model = export_onnx(model, (example_input,), [input_name], path)
    return check_onnx(path, onnx_model, {input_name: example_input.numpy()}, reference)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("models"))
    args = parser.parse_args()

    torch.manual_seed(SEED)
    resnet = TinyResNet()
    randomize_norms_and_biases(resnet)
    build_and_check(resnet, torch.randn(1, 3, 32, 32), "input", args.out / "tiny_resnet.onnx")

    torch.manual_seed(SEED)
    bert = make_bert(hidden=64, heads=2, intermediate=128, layers=1, vocab=1000)
    randomize_norms_and_biases(bert)
    input_ids = torch.randint(0, 1000, (1, 16), dtype=torch.int64)
    build_and_check(bert, input_ids, "input_ids", args.out / "tiny_bert.onnx")

    torch.manual_seed(SEED)
    bert = make_bert(hidden=64, heads=2, intermediate=128, layers=1, vocab=1000)
    randomize_norms_and_biases(bert)
    masked = MaskedLastHiddenState(bert.encoder)
    input_ids = torch.randint(0, 1000, (2, 16), dtype=torch.int64)
    mask = torch.ones((2, 16), dtype=torch.int64)
    with torch.no_grad():
        reference = masked.eval()(input_ids, mask).numpy()
    names = ["input_ids", "attention_mask"]
    axes = {name: {0: "batch", 1: "sequence"} for name in [*names, "output"]}
    path = args.out / "tiny_bert_dynamic.onnx"
    check_onnx(
        path,
        export_onnx(masked, (input_ids, mask), names, path, dynamic_axes=axes),
        {"input_ids": input_ids.numpy(), "attention_mask": mask.numpy()},
        reference,
    )

    torch.manual_seed(SEED)
    gpt2 = make_gpt2(embedding=64, heads=2, layers=1, vocab=1000, positions=16)
    randomize_norms_and_biases(gpt2)
    input_ids = torch.randint(0, 1000, (1, 16), dtype=torch.int64)
    build_and_check(gpt2, input_ids, "input_ids", args.out / "tiny_gpt2.onnx")


if __name__ == "__main__":
    main()
