"""transformers modules as users have them, returning ModelOutputs, through ``collage_core.optimize``.

ResNetForImageClassification and BertModel from small configs with random weights, placed over the CPU
backends with their outputs verified against PyTorch, take half a minute to a few minutes each on 2 cores and
run with --run-slow; a hand-written module returning a ModelOutput with a None field goes the whole way in
the default suite. How outputs are flattened, and what fails before measuring, is tested in test_model_import.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import pytest
import torch

import collage_core

transformers = pytest.importorskip("transformers")
CPU_BACKENDS = ["tvm", "onnxruntime", "openvino", "dnnl"]


@dataclasses.dataclass
class Scored(transformers.utils.ModelOutput):
    loss: Optional[torch.Tensor] = None
    scores: Optional[torch.Tensor] = None
    features: Optional[torch.Tensor] = None


class Scorer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.features, self.scores = torch.nn.Linear(8, 16), torch.nn.Linear(16, 3)

    def forward(self, x):
        features = torch.relu(self.features(x))
        return Scored(scores=self.scores(features), features=features)


def test_a_module_returning_a_model_output_is_placed_and_verified(shared_cost_db, tmp_path):
    torch.manual_seed(0)
    result = collage_core.optimize(
        Scorer(),
        example_inputs=(torch.randn(2, 8),),
        backends=["tvm"],
        search="op-level",
        compare_backends=False,
        calibration_rounds=0,
        cost_db=shared_cost_db,
        output_dir=tmp_path,
        show_progress=False,
    )
    assert result.model.output_names == ("output['scores']", "output['features']")
    assert result.verification.passed, result.verification.describe()
    from collage_core.outputs.mlf import load_mlf
    from collage_core.outputs.mlf_export import export_mlf

    loaded = load_mlf(export_mlf(result, tmp_path / "scorer.tar"), tmp_path / "unpacked")
    assert [output["name"] for output in loaded.executor_config["outputs"]] == ["output['scores']", "output['features']"]


def resnet():
    config = transformers.ResNetConfig(
        embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], layer_type="basic", num_labels=10
    )
    return transformers.ResNetForImageClassification(config), (torch.randn(1, 3, 64, 64),), ("output['logits']",)


def bert():
    config = transformers.BertConfig(
        vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, max_position_embeddings=64
    )
    return (transformers.BertModel(config), (torch.randint(0, 1000, (1, 16)),), ("output['last_hidden_state']", "output['pooler_output']"))


@pytest.mark.slow  # ResNet 2.5 min, BERT half a minute on 2 cores, measuring into an empty cost database
@pytest.mark.parametrize("make", [resnet, bert], ids=["ResNetForImageClassification", "BertModel"])
def test_a_transformers_model_is_placed_over_the_cpu_backends_and_verified(make, tmp_path):
    torch.manual_seed(0)
    module, inputs, outputs = make()
    result = collage_core.optimize(
        module,
        example_inputs=inputs,
        backends=CPU_BACKENDS,
        output_dir=tmp_path / "out",
        cost_db=tmp_path / "costs.sqlite",
        show_progress=False,
    )
    assert result.model.output_names == outputs
    assert result.verification.passed, result.verification.describe()
    placed = sorted(node for part in result.placement.partitions for node in part.nodes)
    assert placed == list(range(len(result.placement.operators)))
    assert (tmp_path / "out" / "placement.json").exists()
