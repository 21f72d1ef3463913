from __future__ import annotations

import pytest
import torch
from torch import nn

from speedtronic_optim import Muon, build_optimizer, route_parameters


def _names(model: nn.Module, params: list[torch.Tensor]) -> set[str]:
    lookup = {id(p): n for n, p in model.named_parameters(remove_duplicate=False)}
    return {lookup[id(p)] for p in params}


@pytest.mark.parametrize("tied", [False, True])
def test_small_transformer_routing(tied: bool, make_lm) -> None:
    model = make_lm(tied=tied)
    routing = route_parameters(model)
    expected_muon = {
        f"blocks.{i}.{name}.weight" for i in range(2) for name in ("qkv", "proj", "fc")
    }
    assert set(routing.muon_names) == expected_muon == _names(model, routing.muon)
    assert "wte.weight" in routing.adamw_names and "ln_f.weight" in routing.adamw_names
    assert "blocks.0.qkv.bias" in routing.adamw_names and "blocks.0.ln.bias" in routing.adamw_names
    assert ("lm_head.weight" in routing.adamw_names) is (not tied)
    all_ids = [id(p) for p in routing.muon + routing.adamw]
    trainable = {id(p) for p in model.parameters()}
    assert len(all_ids) == len(set(all_ids)) and set(all_ids) == trainable
    assert all(p.ndim == 2 for p in routing.muon)


def test_tied_head_first_never_goes_to_muon() -> None:
    class HeadFirst(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.decoder = nn.Linear(
                4, 10, bias=False
            )  # a hidden-looking Linear sharing the embedding
            self.tok = nn.Embedding(10, 4)
            self.decoder.weight = self.tok.weight

    routing = route_parameters(HeadFirst())
    assert routing.muon == [] and len(routing.adamw) == 1


def test_overrides_and_frozen(make_lm) -> None:
    model = make_lm()
    model.blocks[0].fc._speedtronic_optimizer_role = "adamw"
    model.lm_head._speedtronic_optimizer_role = "muon"
    model.blocks[1].proj.weight.requires_grad_(False)
    routing = route_parameters(model)
    assert (
        "blocks.0.fc.weight" in routing.adamw_names
        and "blocks.0.fc.weight" not in routing.muon_names
    )
    assert "lm_head.weight" in routing.muon_names
    assert routing.skipped_names == ["blocks.1.proj.weight"]
    assert all(p.requires_grad for p in routing.muon + routing.adamw)


def test_custom_matrix_parameter_defaults_to_adamw() -> None:
    class Custom(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.matrix = nn.Parameter(torch.zeros(4, 4))

    routing = route_parameters(Custom())
    assert routing.adamw_names == ["matrix"] and routing.muon == []


def test_bad_override_and_non_matrix_muon_override(make_lm) -> None:
    model = make_lm()
    model.blocks[0]._speedtronic_optimizer_role = "sgd"
    with pytest.raises(ValueError, match="blocks.0._speedtronic_optimizer_role"):
        route_parameters(model)
    model = make_lm()
    model.ln_f._speedtronic_optimizer_role = "muon"
    with pytest.raises(ValueError, match=r"ln_f.weight has shape \(16,\)"):
        route_parameters(model)


def test_a_muon_override_takes_the_modules_matrix_and_leaves_its_bias_to_adamw() -> None:
    # A hidden layer whose name reads as a head ("output", as in BERT-style blocks) opts into Muon;
    # a bias is never Muon's (2.0: "biases ... are sent to AdamW"), nor a reason to refuse.
    block = nn.ModuleDict({"norm": nn.LayerNorm(8), "output": nn.Linear(8, 8)})
    assert route_parameters(block).muon_names == []
    block.output._speedtronic_optimizer_role = "muon"
    routing = route_parameters(block)
    assert routing.muon_names == ["output.weight"]
    assert routing.adamw_names == ["norm.weight", "norm.bias", "output.bias"]
    assert routing.muon == [block.output.weight]
    block.norm._speedtronic_optimizer_role = "muon"  # a norm's 1-D weight still cannot be
    with pytest.raises(ValueError, match=r"norm.weight has shape \(8,\) but is routed to Muon"):
        route_parameters(block)


def _transformers_lm(kind: str, tied: bool = False) -> nn.Module:
    transformers = pytest.importorskip("transformers")
    if kind == "gpt2":
        config = transformers.GPT2Config(
            vocab_size=32, n_embd=8, n_layer=2, n_head=2, n_positions=8
        )
        return transformers.GPT2LMHeadModel(config)
    sizes = dict(
        vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=tied,
    )  # fmt: skip
    family = {"llama": "Llama", "qwen2": "Qwen2", "mistral": "Mistral"}[kind]
    config = getattr(transformers, f"{family}Config")(**sizes)
    return getattr(transformers, f"{family}ForCausalLM")(config)


# The hidden matrices of each family, by module name; GPT-2's are transformers' Conv1D, a linear
# layer that stores its weight as (in, out).
_HIDDEN = {
    "llama": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
              "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"),
    "gpt2": ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"),
}  # fmt: skip
_HIDDEN["qwen2"] = _HIDDEN["mistral"] = _HIDDEN["llama"]


@pytest.mark.parametrize(
    ("kind", "tied"),
    [("llama", False), ("llama", True), ("qwen2", False), ("mistral", False), ("gpt2", True)],
)
def test_transformers_models_route_their_hidden_matrices_to_muon(kind: str, tied: bool) -> None:
    """Every hidden projection of a transformers causal LM goes to Muon; embeddings, the head,
    norms and biases to AdamW; a tied head once. GPT-2's Conv1D projections went to AdamW, so
    `optimizer: muon` trained GPT-2 with no Muon at all.
    """
    model = _transformers_lm(kind, tied)
    routing = route_parameters(model)
    stack = "transformer.h" if kind == "gpt2" else "model.layers"
    expected = {f"{stack}.{i}.{name}.weight" for i in range(2) for name in _HIDDEN[kind]}
    assert set(routing.muon_names) == expected == _names(model, routing.muon)
    embeddings = {"transformer.wte.weight", "transformer.wpe.weight"}
    if kind != "gpt2":
        embeddings = {"model.embed_tokens.weight"} | ({"lm_head.weight"} if not tied else set())
    assert embeddings <= set(routing.adamw_names)
    head = model.get_output_embeddings().weight
    assert all(p is not head for p in routing.muon)
    routed = [id(p) for p in routing.muon + routing.adamw]
    assert len(routed) == len(set(routed)) == len({id(p) for p in model.parameters()})


@pytest.mark.parametrize("muon_plus", [False, True])
def test_conv1d_weights_update_as_the_transposed_linear_weights_they_stand_for(
    muon_plus: bool,
) -> None:
    """transformers' Conv1D stores GPT-2's projections as (in, out). Muon read them as (out, in):
    `adjust_lr="original"` scaled c_fc's update by 1 instead of 2 (c_proj's by 2 instead of 1)
    and Muon+'s `row_col` normalized input features where it normalizes output ones. Routed
    Conv1D weights are marked `transposed`, so each update is its nn.Linear twin's, transposed.
    """
    torch.manual_seed(0)
    model = _transformers_lm("gpt2")
    routing = route_parameters(model)
    assert [id(p) for p in routing.transposed] == [id(p) for p in routing.muon]
    twins = [nn.Parameter(param.detach().mT.clone()) for param in routing.muon]
    for param, twin in zip(routing.muon, twins, strict=True):
        param.grad = torch.randn_like(param)
        twin.grad = param.grad.mT.clone()
    options = dict(lr=0.1, adjust_lr="original", muon_plus=muon_plus, ns_dtype=torch.float32)
    Muon(routing.muon_param_groups(), **options).step()
    Muon(twins, **options).step()
    for param, twin in zip(routing.muon, twins, strict=True):
        torch.testing.assert_close(param.detach(), twin.detach().mT, rtol=1e-5, atol=1e-6)
    # The trainer's optimizer (build_optimizer) marks them itself; Linear models stay one group.
    hybrid = build_optimizer(model, {"name": "muon", "muon_plus": True})
    assert [(len(g["params"]), g["transposed"]) for g in hybrid.muon.param_groups] == [(8, True)]
    llama = build_optimizer(_transformers_lm("llama"), {"name": "muon"})
    assert [(len(g["params"]), g["transposed"]) for g in llama.muon.param_groups] == [(14, False)]
