"""Hugging Face config.json files as trnopt models; `models show NAME --toml/--json` loads back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trnopt.optimizer.commands.cli import main
from trnopt.optimizer.errors import InputError
from trnopt.optimizer.model.workload import PRESETS, load_model

HF = Path(__file__).parent / "hf"
# The published config.json files, written here from their model cards' repositories:
# https://huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json and
# https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json (auto_map left out).
FIXTURES = {"Llama-3.1-8B": "llama3-8b", "DeepSeek-V3": "deepseek-v3"}


@pytest.mark.parametrize("folder", sorted(FIXTURES))
def test_published_configs_give_the_presets_parameter_counts(folder):
    hf, preset = load_model(str(HF / folder / "config.json")), load_model(FIXTURES[folder])
    assert hf.name == folder
    assert hf.total_params() == pytest.approx(preset.total_params(), rel=0.005)
    assert hf.active_params() == pytest.approx(preset.active_params(), rel=0.005)
    assert (hf.layers, hf.hidden, hf.heads, hf.kv_heads, hf.vocab, hf.moe, hf.mla) == (
        preset.layers, preset.hidden, preset.heads, preset.kv_heads, preset.vocab, preset.moe, preset.mla)


def test_a_checkpoint_folder_loads_its_config_json():
    assert load_model(str(HF / "Llama-3.1-8B")).total_params() == load_model("llama3-8b").total_params()


def _write(tmp_path, data, name="config.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


LLAMA = json.loads((HF / "Llama-3.1-8B" / "config.json").read_text())
# Mixtral-8x7B-v0.1's config.json (https://huggingface.co/mistralai/Mixtral-8x7B-v0.1), the keys read
MIXTRAL = {"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
           "num_attention_heads": 32, "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2,
           "vocab_size": 32000, "tie_word_embeddings": False}


def test_mixtral_gives_the_preset(tmp_path):
    m, preset = load_model(_write(tmp_path, MIXTRAL)), load_model("mixtral-8x7b")
    assert m.moe == preset.moe and m.ffn == 0
    assert m.total_params() == pytest.approx(preset.total_params(), rel=0.005)


def test_qwen_families(tmp_path):
    # Qwen2-7B: biased QKV (not counted), untied; Qwen3-8B: head_dim given, wider than hidden / heads
    qwen2 = {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
             "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064, "tie_word_embeddings": False}
    m = load_model(_write(tmp_path, qwen2))
    assert (m.head_dim, m.kv_heads, m.moe) == (128, 4, None)
    qwen3 = {"model_type": "qwen3", "hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36,
             "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
             "tie_word_embeddings": True}
    m = load_model(_write(tmp_path, qwen3))
    assert (m.head_dim, m.tied_embeddings) == (128, True)
    # Qwen1.5-MoE-A2.7B: 60 experts of 1408, top-4, one shared expert of 5632 = 4 expert widths
    qwen2_moe = {"model_type": "qwen2_moe", "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 24,
                 "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 151936, "num_experts": 60,
                 "num_experts_per_tok": 4, "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
                 "decoder_sparse_step": 1, "mlp_only_layers": []}
    m = load_model(_write(tmp_path, qwen2_moe))
    assert (m.moe.experts, m.moe.top_k, m.moe.expert_ffn, m.moe.shared_experts, m.moe.dense_layers) == (
        60, 4, 1408, 4, 0)
    qwen3_moe = {**qwen2_moe, "model_type": "qwen3_moe", "num_experts": 128, "num_experts_per_tok": 8,
                 "moe_intermediate_size": 768, "head_dim": 128}
    del qwen3_moe["shared_expert_intermediate_size"]
    m = load_model(_write(tmp_path, qwen3_moe))
    assert (m.moe.experts, m.moe.shared_experts, m.head_dim) == (128, 0, 128)


@pytest.mark.parametrize("change, key", [
    ({"num_hidden_layers": None}, "num_hidden_layers"),
    ({"num_key_value_heads": 5}, "num_key_value_heads"),
    ({"vocab_size": "128256"}, "vocab_size"),
    ({"tie_word_embeddings": 1}, "tie_word_embeddings"),
    ({"model_type": "gpt_neox"}, "model_type"),
    ({"hidden_size": 2**50}, "hidden_size"),
])
def test_a_bad_config_names_the_file_and_the_hf_key(tmp_path, capsys, change, key):
    data = {k: v for k, v in {**LLAMA, **change}.items() if v is not None}
    path = _write(tmp_path, data)
    with pytest.raises(InputError) as err:
        load_model(path)
    assert (err.value.source, err.value.key) == (path, key)
    assert main(["models", "show", path]) == 2
    out = capsys.readouterr()
    assert out.out == "" and len(out.err.strip().splitlines()) == 1 and key in out.err and path in out.err


@pytest.mark.parametrize("change, key", [
    ({"num_experts_per_tok": 9}, "num_experts_per_tok"),
    ({"num_local_experts": 0}, "num_local_experts"),
])
def test_moe_errors_name_the_hf_key(tmp_path, change, key):
    with pytest.raises(InputError) as err:
        load_model(_write(tmp_path, {**MIXTRAL, **change}))
    assert err.value.key == key


def test_a_shared_expert_of_another_width_is_refused(tmp_path):
    data = {"model_type": "qwen2_moe", "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 24,
            "num_attention_heads": 16, "vocab_size": 151936, "num_experts": 60, "num_experts_per_tok": 4,
            "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5000}
    with pytest.raises(InputError) as err:
        load_model(_write(tmp_path, data))
    assert err.value.key == "shared_expert_intermediate_size"


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("fmt", ["--toml", "--json"])
def test_models_show_loads_back_as_the_same_model(tmp_path, capsys, name, fmt):
    assert main(["models", "show", name, fmt]) == 0
    path = tmp_path / f"{name}.{fmt[2:]}"
    path.write_text(capsys.readouterr().out)
    assert load_model(str(path)) == load_model(name)


def test_a_json_model_whose_counts_disagree_with_its_fields_is_refused(tmp_path, capsys):
    assert main(["models", "show", "llama3-8b", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    data["layers"] = 30
    path = _write(tmp_path, data, "mine.json")
    with pytest.raises(InputError) as err:
        load_model(path)
    assert err.value.key == "total_params"
