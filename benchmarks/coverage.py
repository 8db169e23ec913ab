"""Model coverage: architectures from HuggingFace ``transformers`` through every input path, in one resumable run.

    pip install -e ".[bench]" onnxscript
    python benchmarks/coverage.py [--families resnet,vit,...] [--paths torchscript-onnx,dynamo-onnx,torch.export]
                                  [--raw benchmarks/raw-coverage] [--only-report]

Each family is built offline from a small config with seeded random weights (no download) and goes
through three paths: the TorchScript ONNX exporter (opset 17), the dynamo ONNX exporter, and
``torch.export`` straight into Collage. Each model-path pair runs in a fresh process through the
stages a user's run passes: export, import, candidates, an op-level search over TVM and DNNL with a
small measuring budget, build, and numerics against the reference (ONNX Runtime on the exported file,
PyTorch for torch.export). A pair's result lands in ``<raw>/<family>__<path>.json`` as soon as it is
known and is not run again, so an interrupted run resumes; ``benchmarks/COVERAGE.md`` is written from
the raw files: pass, or the failing stage and its one-line error (which names the operator).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]
PATHS = ("torchscript-onnx", "dynamo-onnx", "torch.export")
SEED = 0
IMAGE = (1, 3, 64, 64)
TEXT = (1, 16)
PAIR_TIMEOUT_S = 900
# Where in Collage a failure happened, by the module of the deepest frame (its path in collage_core).
STAGE_OF_MODULE = {
    "model/model_import": "import",
    "candidates/enumeration": "candidates",
    "measure/measurement": "candidates",
    "search/regions": "candidates",
    "search/stage": "search",
    "search/op_level": "search",
    "search/two_level": "search",
    "search/calibration": "search",
    "build/executable": "build",
    "build/stage": "build",
    "build/partition": "build",
    "model/verify": "numerics",
}


def _image_classifier(config_class, model_class, **config):
    def build():
        import torch

        return model_class(config_class(**config)), (torch.randn(*IMAGE),)

    return build


def _text_model(config_class, model_class, seq2seq: bool = False, **config):
    def build():
        import torch

        ids = torch.randint(0, config.get("vocab_size", 128), TEXT)
        model = model_class(config_class(**config))
        if not seq2seq:
            return model, (ids,)

        class EncoderDecoder(torch.nn.Module):  # the second positional argument is the attention mask
            def __init__(self):
                super().__init__()
                self.model = model

            def forward(self, input_ids, decoder_input_ids):
                return self.model(input_ids=input_ids, decoder_input_ids=decoder_input_ids)

        return EncoderDecoder(), (ids, ids.clone())

    return build


def _families() -> dict:
    """Family name -> (kind, builder returning (module, example inputs)); small configs, random weights."""
    import transformers as t

    small_vit = dict(
        image_size=64, patch_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, num_labels=10
    )
    small_text = dict(
        vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, max_position_embeddings=64
    )
    return {
        "resnet": (
            "convolutional",
            _image_classifier(
                t.ResNetConfig,
                t.ResNetForImageClassification,
                embedding_size=16,
                hidden_sizes=[16, 32],
                depths=[1, 1],
                layer_type="basic",
                num_labels=10,
            ),
        ),
        "mobilenet_v2": (
            "convolutional",
            _image_classifier(
                t.MobileNetV2Config,
                t.MobileNetV2ForImageClassification,
                depth_multiplier=0.35,
                image_size=64,
                tf_padding=False,
                num_labels=10,
            ),
        ),
        "convnext": (
            "convolutional",
            _image_classifier(
                t.ConvNextConfig, t.ConvNextForImageClassification, num_stages=2, hidden_sizes=[16, 32], depths=[1, 1], num_labels=10
            ),
        ),
        "efficientnet": (
            "convolutional",
            _image_classifier(
                t.EfficientNetConfig,
                t.EfficientNetForImageClassification,
                image_size=64,
                width_coefficient=0.25,
                depth_coefficient=0.2,
                hidden_dim=320,
                num_labels=10,
            ),
        ),
        "regnet": (
            "convolutional",
            _image_classifier(
                t.RegNetConfig,
                t.RegNetForImageClassification,
                embedding_size=16,
                hidden_sizes=[16, 32],
                depths=[1, 1],
                groups_width=8,
                num_labels=10,
            ),
        ),
        "mobilevit": (
            "convolutional with attention",
            _image_classifier(t.MobileViTConfig, t.MobileViTForImageClassification, image_size=64, num_labels=10),
        ),
        "vit": ("vision transformer", _image_classifier(t.ViTConfig, t.ViTForImageClassification, **small_vit)),
        "deit": ("vision transformer", _image_classifier(t.DeiTConfig, t.DeiTForImageClassification, **small_vit)),
        "dinov2": ("vision transformer", _image_classifier(t.Dinov2Config, t.Dinov2ForImageClassification, **small_vit)),
        "swin": (
            "windowed hierarchical vision transformer",
            _image_classifier(
                t.SwinConfig,
                t.SwinForImageClassification,
                image_size=64,
                patch_size=4,
                embed_dim=16,
                depths=[1, 1],
                num_heads=[2, 2],
                window_size=4,
                num_labels=10,
            ),
        ),
        "pvt": (
            "hierarchical vision transformer",
            _image_classifier(
                t.PvtConfig, t.PvtForImageClassification, image_size=64, depths=[1, 1, 1, 1], hidden_sizes=[16, 32, 80, 128], num_labels=10
            ),
        ),
        "segformer": (
            "segmentation",
            _image_classifier(
                t.SegformerConfig,
                t.SegformerForSemanticSegmentation,
                num_encoder_blocks=2,
                depths=[1, 1],
                sr_ratios=[2, 1],
                hidden_sizes=[16, 32],
                patch_sizes=[7, 3],
                strides=[4, 2],
                num_attention_heads=[1, 2],
                mlp_ratios=[2, 2],
                decoder_hidden_size=32,
                num_labels=4,
            ),
        ),
        "yolos": (
            "detection",
            _image_classifier(
                t.YolosConfig,
                t.YolosForObjectDetection,
                image_size=[64, 64],
                num_detection_tokens=5,
                **{k: v for k, v in small_vit.items() if k not in ("image_size", "num_labels")},
            ),
        ),
        "bert": ("encoder-only text", _text_model(t.BertConfig, t.BertModel, **small_text)),
        "distilbert": (
            "encoder-only text",
            _text_model(
                t.DistilBertConfig,
                t.DistilBertModel,
                vocab_size=128,
                dim=32,
                n_layers=2,
                n_heads=2,
                hidden_dim=64,
                max_position_embeddings=64,
            ),
        ),
        "deberta_v2": ("encoder-only text", _text_model(t.DebertaV2Config, t.DebertaV2Model, **small_text)),
        "gpt2": (
            "decoder-only text",
            _text_model(
                t.GPT2Config,
                t.GPT2LMHeadModel,
                vocab_size=128,
                n_embd=32,
                n_layer=2,
                n_head=2,
                n_positions=64,
                bos_token_id=0,
                eos_token_id=0,
            ),
        ),
        "llama": ("decoder-only text", _text_model(t.LlamaConfig, t.LlamaForCausalLM, num_key_value_heads=1, **small_text)),
        "opt": (
            "decoder-only text",
            _text_model(
                t.OPTConfig,
                t.OPTForCausalLM,
                vocab_size=128,
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=2,
                ffn_dim=64,
                word_embed_proj_dim=32,
                max_position_embeddings=64,
            ),
        ),
        "t5": (
            "encoder-decoder text",
            _text_model(t.T5Config, t.T5Model, seq2seq=True, vocab_size=128, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2),
        ),
        "bart": (
            "encoder-decoder text",
            _text_model(
                t.BartConfig,
                t.BartModel,
                seq2seq=True,
                vocab_size=128,
                d_model=32,
                encoder_layers=2,
                decoder_layers=2,
                encoder_attention_heads=2,
                decoder_attention_heads=2,
                encoder_ffn_dim=64,
                decoder_ffn_dim=64,
                max_position_embeddings=64,
            ),
        ),
        "wav2vec2": ("speech encoder", _speech(t.Wav2Vec2Config, t.Wav2Vec2Model)),
        "whisper_encoder": ("speech encoder", _whisper_encoder),
    }


def _speech(config_class, model_class):
    def build():
        import torch

        config = config_class(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            conv_dim=(16, 16),
            conv_stride=(5, 2),
            conv_kernel=(10, 3),
            num_conv_pos_embeddings=16,
            num_conv_pos_embedding_groups=2,
            do_stable_layer_norm=True,
        )
        return model_class(config), (torch.randn(1, 4000),)

    return build


def _whisper_encoder():
    import torch
    import transformers as t

    config = t.WhisperConfig(
        vocab_size=128,
        num_mel_bins=16,
        d_model=32,
        encoder_layers=2,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_source_positions=32,
        max_target_positions=16,
        pad_token_id=0,
        bos_token_id=0,
        eos_token_id=0,
        decoder_start_token_id=0,
    )
    return t.WhisperModel(config).get_encoder(), (torch.randn(1, 16, 64),)


class FirstTensor:
    """Wraps a transformers model so that it returns one tensor: its logits or its last hidden state."""

    def __new__(cls, model):
        import torch

        class Wrapped(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.model = model

            def forward(self, *args):
                out = self.model(*args)
                for name in ("logits", "last_hidden_state"):
                    value = getattr(out, name, None)
                    if value is not None:
                        return value
                return out[0] if isinstance(out, (tuple, list)) else out

        return Wrapped().eval()


def _stage_of(error: BaseException) -> str:
    stage = "search"
    for frame in traceback.extract_tb(error.__traceback__):
        path = Path(frame.filename).with_suffix("")
        module = "/".join(path.parts[path.parts.index("collage_core") + 1 :]) if "collage_core" in path.parts else ""
        if module in STAGE_OF_MODULE:
            stage = STAGE_OF_MODULE[module]
    return stage


def _one_line(error: BaseException) -> str:
    """The error's type and its last telling line, and its cause's (exporters wrap the error that matters)."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip() and not line.strip().startswith("(Refer")]
    text = f"{type(error).__name__}: {lines[-1] if lines else ''}"
    if error.__cause__ is not None and error.__cause__ is not error:
        text += f" (caused by {_one_line(error.__cause__)})"
    return text[:400]


def run_pair(family: str, path: str, workdir: Path) -> dict:
    """Export, import, place and verify one family through one path; what happened, stage by stage."""
    import torch

    import collage_core
    from collage_core.measure.timing import MeasureSettings
    from collage_core.model.model_import import load_model

    torch.manual_seed(SEED)
    kind, builder = _families()[family]
    record = {"family": family, "kind": kind, "path": path, "stages": {}}
    module, inputs = builder()
    module = FirstTensor(module.eval())
    started = time.perf_counter()
    try:
        if path == "torch.export":
            model, example = module, inputs
        else:
            onnx_path = workdir / f"{family}.onnx"
            with torch.no_grad():
                if path == "torchscript-onnx":
                    torch.onnx.export(module, inputs, str(onnx_path), opset_version=17, dynamo=False)
                else:
                    torch.onnx.export(module, inputs, str(onnx_path), dynamo=True, external_data=False)
            model, example = str(onnx_path), None
        record["stages"]["export"] = round(time.perf_counter() - started, 2)
    except Exception as error:
        return {**record, "failed": "export", "error": _one_line(error)}
    try:
        started = time.perf_counter()
        imported = load_model(model, example_inputs=example, name=family)
        record["stages"]["import"] = round(time.perf_counter() - started, 2)
        record["operators"] = len(imported.mod["main"].body.blocks[0].bindings)
        quick = MeasureSettings(warmup=1, min_repeats=1, max_repeats=3, min_repeat_ms=1.0, time_bound_s=0.2)
        started = time.perf_counter()
        result = collage_core.optimize(
            imported,
            backends=["tvm", "dnnl"],
            search="op-level",
            compare_backends=False,
            calibration_rounds=0,
            settings=quick,
            cost_db=workdir / "costs.sqlite",
            show_progress=False,
        )
        record["stages"]["candidates, search, build"] = round(time.perf_counter() - started, 2)
        record["candidates"] = result.candidates
        placed: dict = {}
        for partition in result.placement.partitions:
            placed[partition.backend] = placed.get(partition.backend, 0) + len(partition.nodes)
        record["placed"] = dict(sorted(placed.items()))
    except Exception as error:
        stage = "import" if "import" not in record["stages"] else _stage_of(error)
        return {**record, "failed": stage, "error": _one_line(error)}
    verification = result.verification
    record["numerics"] = verification.describe()
    if not verification.passed:
        return {**record, "failed": "numerics", "error": verification.describe()}
    return {**record, "failed": None}


def measure_all(families, paths, raw: Path) -> None:
    raw.mkdir(parents=True, exist_ok=True)
    pairs = [(family, path) for family in families for path in paths]
    for index, (family, path) in enumerate(pairs, 1):
        out = raw / f"{family}__{path}.json"
        if out.exists():
            continue
        print(f"[{index}/{len(pairs)}] {family} via {path} ...", end=" ", flush=True)
        started = time.perf_counter()
        try:
            done = subprocess.run(
                [sys.executable, __file__, "--one", family, path, "--raw", str(raw)], capture_output=True, text=True, timeout=PAIR_TIMEOUT_S
            )
            if not out.exists():
                tail = [line for line in done.stderr.splitlines() if line.strip()][-1:] or [f"exit {done.returncode}"]
                out.write_text(json.dumps({"family": family, "path": path, "failed": "crash", "error": tail[0][:400]}))
        except subprocess.TimeoutExpired:
            out.write_text(
                json.dumps({"family": family, "path": path, "failed": "timeout", "error": f"no result within {PAIR_TIMEOUT_S} s"})
            )
        result = json.loads(out.read_text())
        print(
            f"{'passed' if not result['failed'] else 'FAILED at ' + result['failed']} ({time.perf_counter() - started:.0f} s)", flush=True
        )


def write_report(raw: Path, families, paths, command: str, report: Path) -> None:
    import platform
    from importlib.metadata import version

    cpu = (
        next(
            (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")),
            platform.machine(),
        )
        if Path("/proc/cpuinfo").exists()
        else platform.machine()
    )
    versions = ", ".join(f"{name} {version(name)}" for name in ("torch", "transformers", "onnx", "onnxscript", "onnxruntime", "apache-tvm"))
    results = {}
    for file in sorted(raw.glob("*.json")):
        record = json.loads(file.read_text())
        results[(record["family"], record["path"])] = record
    shown = [family for family in families if any((family, path) in results for path in paths)]
    counted = [record for (family, path), record in results.items() if family in shown and path in paths]
    passed, total = sum(1 for record in counted if not record["failed"]), len(counted)
    lines = [
        "# Model coverage",
        "",
        f"Command: `{command}`. Machine: {cpu}, {os.cpu_count()} cores, Python {platform.python_version()}; {versions}. "
        "Each pair in a fresh "
        "process: export, import, candidates, an op-level search over TVM and DNNL with a small measuring budget, build, "
        "numerics against ONNX Runtime on the exported file (PyTorch for torch.export). Small configs, seeded random "
        "weights, built offline from `transformers` configs.",
        "",
        f"**{passed} of {total} model-path pairs pass numerics ({100 * passed / max(total, 1):.0f}%).**",
        "",
        "| family | kind | " + " | ".join(paths) + " |",
        "|---|---|" + "---|" * len(paths),
    ]
    failures = []
    for family in shown:
        kind = next((results[(family, p)].get("kind", "") for p in paths if (family, p) in results), "")
        cells = []
        for path in paths:
            record = results.get((family, path))
            if record is None:
                cells.append("not run")
            elif not record["failed"]:
                cells.append("pass")
            else:
                failures.append(f"- {family} via {path}, at {record['failed']}: {record['error']}")
                cells.append(f"fails at {record['failed']}")
        lines.append(f"| {family} | {kind} | " + " | ".join(cells) + " |")
    if failures:
        lines += ["", "Failures, each with its one-line error:", "", *failures]
    report.write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default=None, help="comma-separated (default: every family)")
    parser.add_argument("--paths", default=",".join(PATHS))
    parser.add_argument("--raw", type=Path, default=ROOT / "benchmarks" / "raw-coverage")
    parser.add_argument("--report", type=Path, default=ROOT / "benchmarks" / "COVERAGE.md")
    parser.add_argument("--only-report", action="store_true")
    parser.add_argument("--one", nargs=2, metavar=("FAMILY", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        import tempfile

        family, path = args.one
        with tempfile.TemporaryDirectory(prefix="collage-coverage-") as scratch:
            record = run_pair(family, path, Path(scratch))
        args.raw.mkdir(parents=True, exist_ok=True)
        (args.raw / f"{family}__{path}.json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        return
    families = args.families.split(",") if args.families else list(_families())
    paths = args.paths.split(",")
    if not args.only_report:
        measure_all(families, paths, args.raw)
    command = " ".join(["python benchmarks/coverage.py", *(a for a in sys.argv[1:] if a != "--only-report")])
    write_report(args.raw, families, paths, command, args.report)
    print(f"wrote {args.report}")


if __name__ == "__main__":
    main()
