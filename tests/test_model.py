"""Model input: presets with the shapes of shared/reference/planners.md §4.3, parameter counts, a
Hugging Face config.json read directly (GQA included), and training-setting validation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hexhelix.ir.errors import InvalidInputError
from hexhelix.ir.model import PRESETS, ModelConfig, TrainingConfig, load_model

# planners.md §4.3: layers, hidden, heads, KV heads, FFN, vocab
SHAPES = {
    "llama2-7b": (32, 4096, 32, 32, 11008, 32000),
    "llama2-13b": (40, 5120, 40, 40, 13824, 32000),
    "llama-30b": (60, 6656, 52, 52, 17920, 32000),
    "llama2-70b": (80, 8192, 64, 8, 28672, 32000),
}
# planners.md §4.3 "params [derived]", in billions
PARAMS_B = {"llama2-7b": 6.74, "llama2-13b": 13.02, "llama-30b": 32.53, "llama2-70b": 68.98}


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_preset_shapes(name: str) -> None:
    m = PRESETS[name]
    assert (m.layers, m.hidden, m.heads, m.kv_heads, m.ffn, m.vocab) == SHAPES[name]
    assert not m.tie_embeddings


@pytest.mark.parametrize("name", sorted(PARAMS_B))
def test_parameter_counts_within_one_percent(name: str) -> None:
    assert PRESETS[name].total_params / 1e9 == pytest.approx(PARAMS_B[name], rel=0.01)


def test_parameter_count_by_hand_for_7b() -> None:
    # per layer: q,k,v,o 4h², gate/up/down 3hf, two RMSNorm weights 2h; plus embedding, final norm, head
    h, f, V, L = 4096, 11008, 32000, 32
    per_layer = 4 * h * h + 3 * h * f + 2 * h
    m = PRESETS["llama2-7b"]
    assert m.params_per_layer == per_layer
    assert m.total_params == L * per_layer + V * h + h + V * h


def test_gqa_shrinks_kv_projections() -> None:
    m = PRESETS["llama2-70b"]
    assert (m.head_dim, m.kv_hidden) == (128, 1024)
    assert m.params_per_layer == 2 * 8192**2 + 2 * 8192 * 1024 + 3 * 8192 * 28672 + 2 * 8192


def test_tiny_preset_is_small_and_tp_friendly() -> None:
    m = PRESETS["tiny"]
    assert m.layers == 8 and m.hidden <= 128 and m.total_params < 1e6
    for tp in (1, 2, 4):
        m.check_tp(tp)


def test_check_tp_names_the_divisibility_problem() -> None:
    with pytest.raises(InvalidInputError, match=r"heads=52 .* not divisible by TP degree 8"):
        PRESETS["llama-30b"].check_tp(8)
    with pytest.raises(InvalidInputError, match="kv_heads=8"):
        PRESETS["llama2-70b"].check_tp(16)
    with pytest.raises(InvalidInputError, match="positive"):
        PRESETS["tiny"].check_tp(0)


def _hf_config(**overrides: object) -> dict:
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": 8192, "num_hidden_layers": 80, "num_attention_heads": 64,
        "num_key_value_heads": 8, "intermediate_size": 28672, "vocab_size": 32000,
        "rms_norm_eps": 1e-5, "torch_dtype": "float16",
    }
    cfg.update(overrides)
    return cfg


def test_hf_config_is_read_directly_with_gqa(tmp_path: Path) -> None:
    path = tmp_path / "Llama-2-70b-hf" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(_hf_config()))
    m = load_model(str(path))
    assert (m.layers, m.hidden, m.heads, m.kv_heads, m.ffn, m.vocab) == SHAPES["llama2-70b"]
    assert m.name == "Llama-2-70b-hf"
    assert m.total_params == PRESETS["llama2-70b"].total_params


def test_hf_config_without_kv_heads_means_multi_head(tmp_path: Path) -> None:
    cfg = _hf_config(num_key_value_heads=None, tie_word_embeddings=True)
    del cfg["num_key_value_heads"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    m = load_model(str(path))
    assert m.kv_heads == m.heads == 64
    assert m.tie_embeddings and m.head_params == m.hidden


@pytest.mark.parametrize(("override", "field"), [
    ({"num_hidden_layers": None}, "num_hidden_layers"),
    ({"hidden_size": "8192"}, "hidden_size"),
    ({"num_key_value_heads": 6}, "num_key_value_heads"),
    ({"hidden_size": 8190}, "hidden_size"),
])
def test_bad_hf_config_names_file_and_hf_field(tmp_path: Path, override: dict, field: str) -> None:
    cfg = _hf_config(**override)
    cfg = {k: v for k, v in cfg.items() if v is not None}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(InvalidInputError) as err:
        load_model(str(path))
    assert (err.value.source, err.value.field) == (str(path), field)


def test_hexhelix_model_json_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    path.write_text(json.dumps(PRESETS["llama2-13b"].to_dict()))
    assert load_model(str(path)) == PRESETS["llama2-13b"]
    assert ModelConfig.from_dict(PRESETS["tiny"].to_dict()) == PRESETS["tiny"]


def test_unknown_model_names_the_presets() -> None:
    with pytest.raises(InvalidInputError, match=r"not a preset .*llama2-7b"):
        load_model("llama-9000")


def test_training_config_defaults_and_validation() -> None:
    t = TrainingConfig()
    assert (t.global_batch, t.micro_batch, t.seq_len, t.recompute, t.dtype_bytes) == (64, 1, 4096, "none", 2)
    assert t.state_bytes_per_param == 16.0
    assert TrainingConfig(global_batch=32, micro_batch=4).num_micro_batches == 8
    assert TrainingConfig.from_dict(t.to_dict()) == t
    for kwargs, field in [({"global_batch": 6, "micro_batch": 4}, "global_batch"),
                          ({"recompute": "some"}, "recompute"), ({"seq_len": 0}, "seq_len"),
                          ({"micro_batch": 1.5}, "micro_batch"), ({"dtype": "fp8"}, "dtype"),
                          ({"global_batch": 10**12}, "global_batch"),
                          ({"state_bytes_per_param": float("nan")}, "state_bytes_per_param"),
                          ({"state_bytes_per_param": float("inf")}, "state_bytes_per_param")]:
        with pytest.raises(InvalidInputError) as err:
            TrainingConfig(**kwargs)
        assert err.value.field == field


@pytest.mark.parametrize(("patch", "field"), [
    ({"tie_embeddings": []}, "tie_embeddings"),
    ({"tie_embeddings": "yes"}, "tie_embeddings"),
    ({"name": ""}, "name"),
    ({"name": ["llama"]}, "name"),
    ({"layers": 2.5}, "layers"),
    ({"layers": 10**12}, "layers"),
])
def test_a_model_document_with_a_field_of_the_wrong_kind_names_that_field(patch: dict, field: str) -> None:
    with pytest.raises(InvalidInputError) as err:
        ModelConfig.from_dict({**PRESETS["tiny"].to_dict(), **patch}, source="m.json")
    assert (err.value.source, err.value.field) == ("m.json", field)
