from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from speedtronic_config import ConfigError
from speedtronic_model.model import (
    CausalSelfAttention,
    GPTConfig,
    KVCache,
    ReferenceTransformer,
    RotaryEmbedding,
    _attention_mask,
    apply_rope,
)

SMALL = dict(vocab_size=97, block_size=16, n_layer=2, n_head=4, n_kv_head=2, d_model=32)


def small(**overrides) -> ReferenceTransformer:
    torch.manual_seed(0)
    return ReferenceTransformer(**{**SMALL, **overrides})


def tokens(batch: int = 2, length: int = 16, vocab: int = 97, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


# -- config ---------------------------------------------------------------------------------


def test_config_resolves_defaults_and_alias():
    cfg = GPTConfig.from_kwargs(max_seq_len=64, d_model=64, n_head=8)
    assert (cfg.block_size, cfg.n_kv_head, cfg.d_ff, cfg.head_dim) == (64, 8, 256, 8)


@pytest.mark.parametrize(
    "kwargs, path",
    [
        (dict(d_model=66, n_head=4), "model.d_model"),
        (dict(n_head=8, n_kv_head=3), "model.n_kv_head"),
        (dict(d_model=96, n_head=32), "model.d_model"),  # head_dim 3 is odd
        (dict(block_size=0), "model.max_seq_len"),
        (dict(vocab_size=-1), "model.vocab_size"),
        (dict(n_layer=True), "model.n_layer"),
        (dict(d_ff=2.5), "model.d_ff"),
        (dict(dropout=1.0), "model.dropout"),
        (dict(rope_base=0.0), "model.rope_base"),
    ],
)
def test_config_rejects_bad_values_naming_the_path(kwargs, path):
    with pytest.raises(ConfigError, match=path):
        GPTConfig(**kwargs)


def test_unknown_field_suggests_the_close_name():
    with pytest.raises(ConfigError, match="n_layers.*did you mean 'n_layer'"):
        ReferenceTransformer(n_layers=2)


def test_conflicting_alias_is_rejected():
    with pytest.raises(ConfigError, match="max_seq_len"):
        ReferenceTransformer(block_size=16, max_seq_len=32)


# -- forward and loss -----------------------------------------------------------------------


def test_forward_shapes_and_loss_only_with_labels():
    model = small()
    ids = tokens()
    assert set(model(ids)) == {"logits"}
    out = model(ids, labels=ids, extra_batch_key=torch.zeros(1))
    assert out["logits"].shape == (2, 16, 97)
    assert out["loss"].dim() == 0


def test_loss_near_ln_vocab_at_init():
    model = small(vocab_size=1000, d_model=64)
    ids, labels = tokens(8, 16, 1000, seed=2), tokens(8, 16, 1000, seed=3)
    loss = model(ids, labels=labels)["loss"].item()
    assert abs(loss - math.log(1000)) < 0.1


def test_labels_are_already_shifted_not_shifted_again():
    model = small()
    ids = tokens(2, 16)
    labels = torch.roll(ids, -1, dims=1)
    labels[:, -1] = -100
    labels[0, :3] = -100
    out = model(ids, labels=labels)
    logits = out["logits"]
    keep = labels != -100
    # position t's logits are scored against labels[t], never labels[t + 1]
    expected = F.cross_entropy(logits[keep], labels[keep])
    torch.testing.assert_close(out["loss"], expected)
    double_shift = F.cross_entropy(
        logits[:, :-1].reshape(-1, 97), labels[:, 1:].reshape(-1), ignore_index=-100
    )
    assert not torch.isclose(out["loss"], double_shift)


def test_all_ignored_labels_give_zero_loss_and_gradients():
    model = small()
    ids = tokens()
    loss = model(ids, labels=torch.full_like(ids, -100))["loss"]
    loss.backward()
    assert loss.item() == 0.0
    assert all(torch.all(p.grad == 0) for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda m, ids: m(ids[0]), "input_ids must be"),
        (lambda m, ids: m(torch.zeros(1, 17, dtype=torch.long)), "exceeds block_size 16"),
        (lambda m, ids: m(ids, labels=ids[:, 1:]), "already shifted"),
        (
            lambda m, ids: m(ids, attention_mask=torch.ones(2, 3, dtype=torch.bool)),
            "attention_mask shape",
        ),
    ],
)
def test_bad_inputs_are_rejected(call, message):
    with pytest.raises(ValueError, match=message):
        call(small(), tokens())


# -- causality, masking, attention -----------------------------------------------------------


@pytest.mark.parametrize("t", [0, 5, 15])
def test_changing_position_t_never_changes_earlier_logits(t):
    model = small().eval()
    ids = tokens(1, 16)
    changed = ids.clone()
    changed[0, t] = (ids[0, t] + 1) % 97
    before, after = model(ids)["logits"], model(changed)["logits"]
    torch.testing.assert_close(before[:, :t], after[:, :t], rtol=0, atol=0)
    assert not torch.allclose(before[:, t], after[:, t])


def test_left_padding_mask_gives_the_unpadded_logits():
    # RoPE scores depend only on relative position, so a masked left pad must not change a thing.
    model = small().eval()
    real = tokens(1, 10)
    padded = torch.cat([torch.zeros(1, 6, dtype=torch.long), real], dim=1)
    mask = torch.cat(
        [torch.zeros(1, 6, dtype=torch.bool), torch.ones(1, 10, dtype=torch.bool)], dim=1
    )
    out = model(padded, attention_mask=mask)["logits"]
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[:, 6:], model(real)["logits"], rtol=1e-4, atol=1e-5)
    unmasked = model(padded)["logits"][:, 6:]
    assert not torch.allclose(unmasked, out[:, 6:], atol=1e-3)


def test_all_true_mask_takes_the_plain_causal_path():
    assert _attention_mask(torch.ones(2, 8, dtype=torch.bool), 8) is None
    assert _attention_mask(torch.tensor([[1, 1, 0]]), 3).shape == (1, 1, 3, 3)


def test_compiled_model_matches_eager_with_and_without_padding_and_does_not_warn(caplog):
    # The mask check is a data-dependent branch; it must run eagerly without dynamo's graph-break
    # warning (15 lines on every compiled run before) and still honour a real padding mask.
    model = small().eval()
    compiled = torch.compile(model)
    ids = tokens(2, 16)
    full = torch.ones(2, 16, dtype=torch.bool)
    padded = full.clone()
    padded[0, :4] = False
    with caplog.at_level("WARNING"):
        for mask in (full, padded):
            torch.testing.assert_close(
                compiled(ids, attention_mask=mask)["logits"],
                model(ids, attention_mask=mask)["logits"],
                rtol=1e-4,
                atol=1e-5,
            )
    assert not [r for r in caplog.records if "Graph break" in r.getMessage()]


def naive_attention(
    attn: CausalSelfAttention, x: torch.Tensor, rope: RotaryEmbedding, keep: torch.Tensor
) -> torch.Tensor:
    """Textbook attention: repeat KV heads, explicit masked softmax."""
    B, T, _ = x.shape
    H, KV, D = attn.n_head, attn.n_kv_head, attn.head_dim
    q = attn.q_proj(x).view(B, T, H, D).transpose(1, 2)
    k = attn.k_proj(x).view(B, T, KV, D).transpose(1, 2).repeat_interleave(H // KV, dim=1)
    v = attn.v_proj(x).view(B, T, KV, D).transpose(1, 2).repeat_interleave(H // KV, dim=1)
    cos, sin = rope(T, x.device, x.dtype)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    scores = q @ k.transpose(-1, -2) / math.sqrt(D)
    allowed = torch.ones(T, T).tril().bool() & keep[:, None, None, :]
    allowed = allowed | torch.eye(T, dtype=torch.bool)
    y = scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ v
    return attn.o_proj(y.transpose(1, 2).reshape(B, T, H * D))


@pytest.mark.parametrize("n_kv_head", [4, 2, 1])
@pytest.mark.parametrize("padded", [False, True])
def test_sdpa_matches_naive_attention(n_kv_head, padded):
    torch.manual_seed(0)
    cfg = GPTConfig(**{**SMALL, "n_kv_head": n_kv_head})
    attn, rope = CausalSelfAttention(cfg).eval(), RotaryEmbedding(cfg.head_dim, max_seq_len=16)
    x = torch.randn(2, 16, 32)
    keep = torch.ones(2, 16, dtype=torch.bool)
    if padded:
        keep[0, :5] = False
        keep[1, 12:] = False
    got = attn(x, rope, _attention_mask(keep, 16))
    torch.testing.assert_close(got, naive_attention(attn, x, rope, keep), rtol=1e-4, atol=1e-5)


def test_gqa_shapes_and_parameter_savings():
    full, grouped = small(n_kv_head=4), small(n_kv_head=1)
    attn = grouped.blocks[0].attn
    assert attn.q_proj.weight.shape == (32, 32)
    assert attn.k_proj.weight.shape == attn.v_proj.weight.shape == (8, 32)  # one KV head of dim 8
    saved = full.num_parameters() - grouped.num_parameters()
    assert (
        saved == 2 * 2 * (4 - 1) * 8 * 32
    )  # layers * (k and v) * dropped heads * head_dim * d_model
    assert grouped(tokens())["logits"].shape == (2, 16, 97)


def test_rope_scores_depend_only_on_relative_position():
    rope = RotaryEmbedding(16, max_seq_len=8)  # grows past its cache on demand
    cos, sin = rope(64, torch.device("cpu"), torch.float32)
    q, k = torch.randn(16), torch.randn(16)

    def score(m: int, n: int) -> torch.Tensor:
        qm = apply_rope(q.view(1, 1, 1, 16), cos[m : m + 1], sin[m : m + 1])
        kn = apply_rope(k.view(1, 1, 1, 16), cos[n : n + 1], sin[n : n + 1])
        return (qm * kn).sum()

    torch.testing.assert_close(score(7, 3), score(57, 53), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(score(3, 3), (q * k).sum(), rtol=1e-5, atol=1e-5)
    assert not torch.isclose(score(7, 3), score(7, 5))


def test_rope_tables_are_not_saved_in_the_state_dict():
    assert not any(
        "cos" in key or "sin" in key or "inv_freq" in key for key in small().state_dict()
    )


def test_a_model_built_on_the_meta_device_computes_its_rope_tables_on_to_empty():
    # The large-model recipe: build on meta, to_empty(), load a checkpoint. No checkpoint holds the
    # RoPE tables, so to_empty's uninitialised memory gave NaN logits.
    reference = small().eval()
    with torch.device("meta"):
        model = small()
    model.to_empty(device="cpu").load_state_dict(reference.state_dict())
    assert torch.equal(model.eval()(tokens())["logits"], reference(tokens())["logits"])


def test_rope_tables_are_computed_again_not_rounded_on_a_dtype_round_trip():
    model, reference = small(), small()
    model.to(torch.bfloat16).float()  # weights rounded, tables recomputed from rope_base
    for name in ("inv_freq", "cos_cached", "sin_cached"):
        assert torch.equal(getattr(model.rope, name), getattr(reference.rope, name)), name
    assert model.to(torch.bfloat16).rope.cos_cached.dtype == torch.bfloat16
    assert torch.equal(model.rope.cos_cached, reference.rope.cos_cached.to(torch.bfloat16))


# -- tying, init, optimizer roles ----------------------------------------------------------


def test_tied_embedding_and_head_share_one_tensor():
    tied, untied = small(), small(tie_weights=False)
    assert tied.lm_head.weight is tied.tok_emb.weight
    assert untied.lm_head.weight is not untied.tok_emb.weight
    assert untied.num_parameters() - tied.num_parameters() == 97 * 32
    loss = tied(tokens(), labels=tokens(seed=4))["loss"]
    loss.backward()
    assert tied.tok_emb.weight.grad is tied.lm_head.weight.grad


def test_loading_with_assign_keeps_the_head_tied():
    # The meta-device recipe's other way in: load_state_dict(assign=True) put the checkpoint's
    # two entries in as two parameters, so training moved them apart and the export (which
    # writes the embedding once) dropped the head's.
    reference = small().eval()
    with torch.device("meta"):
        model = small()
    model.load_state_dict(reference.state_dict(), assign=True)
    assert model.lm_head.weight is model.tok_emb.weight
    assert model.num_parameters() == reference.num_parameters()
    assert model.rope.cos_cached.device.type == "cpu"  # built where the weights landed
    assert torch.equal(model.eval()(tokens())["logits"], reference(tokens())["logits"])


def test_a_tied_model_refuses_a_checkpoint_whose_head_differs_from_its_embedding():
    untied = small(tie_weights=False).state_dict()
    model = small()
    with pytest.raises(ValueError, match="tie_weights") as error:
        model.load_state_dict(untied)
    assert "\n" not in str(error.value)
    assert torch.equal(model.tok_emb.weight, small().tok_emb.weight)  # nothing loaded
    del untied["tok_emb.weight"]
    model.load_state_dict(untied, strict=False)  # 2.0's load: the head's values in both
    assert torch.equal(model.tok_emb.weight, untied["lm_head.weight"])
    assert model.lm_head.weight is model.tok_emb.weight
    copies = {name: value.clone() for name, value in small().state_dict().items()}
    small().load_state_dict(copies)  # equal copies (a safetensors round trip) load
    copies["tok_emb.weight"][0, 0] = math.nan  # a diverged run's: still one tensor saved twice
    copies["lm_head.weight"] = copies["tok_emb.weight"].clone()
    small().load_state_dict(copies)


@pytest.mark.parametrize("assign", [False, True])
def test_a_tied_model_loads_a_state_dict_without_its_head_strictly(assign):
    # Another tool's save of a tied model holds the embedding once: strict loading failed with
    # torch's "Missing key(s) in state_dict: "lm_head.weight"", though the embedding is the head.
    weights = {k: v + 1 for k, v in small().state_dict().items() if k != "lm_head.weight"}
    model = small()
    loaded = model.load_state_dict(weights, assign=assign)
    assert (loaded.missing_keys, loaded.unexpected_keys) == ([], [])
    assert "lm_head.weight" not in weights  # the caller's dict is left as it was
    assert model.lm_head.weight is model.tok_emb.weight
    assert torch.equal(model.tok_emb.weight, weights["tok_emb.weight"])
    wrapped = torch.nn.Sequential(small())  # under a prefix, as in a wrapper's state dict
    wrapped.load_state_dict({f"0.{k}": v for k, v in weights.items()}, assign=assign)
    assert torch.equal(wrapped[0].lm_head.weight, weights["tok_emb.weight"])


def test_share_memory_shares_the_rebuilt_rope_tables_too():
    model = small().share_memory()
    assert model.rope.cos_cached.is_shared() and model.rope.inv_freq.is_shared()


def test_embedding_and_head_are_routed_to_adamw():
    for model in (small(), small(tie_weights=False)):
        assert model.tok_emb._speedtronic_optimizer_role == "adamw"
        assert model.lm_head._speedtronic_optimizer_role == "adamw"


def test_residual_projections_get_scaled_init():
    model = small(n_layer=8, d_model=128, n_head=4, n_kv_head=4)
    assert model.blocks[0].attn.q_proj.weight.std().item() == pytest.approx(0.02, rel=0.05)
    scaled = 0.02 / math.sqrt(16)
    assert model.blocks[0].attn.o_proj.weight.std().item() == pytest.approx(scaled, rel=0.05)
    assert model.blocks[0].mlp.w_down.weight.std().item() == pytest.approx(scaled, rel=0.05)


# -- gradient checkpointing ----------------------------------------------------------------


def test_gradient_checkpointing_gives_the_same_loss_and_gradients():
    plain, ckpt = small(), small(gradient_checkpointing=True)
    ids, labels = tokens(), tokens(seed=5)
    results = []
    for model in (plain, ckpt):
        loss = model(ids, labels=labels)["loss"]
        loss.backward()
        results.append((loss.detach(), {n: p.grad for n, p in model.named_parameters()}))
    torch.testing.assert_close(results[0][0], results[1][0])
    for name, grad in results[0][1].items():
        torch.testing.assert_close(results[1][1][name], grad, msg=name)


def test_set_gradient_checkpointing_toggles_every_block():
    model = small()
    model.set_gradient_checkpointing(True)
    assert model.config.gradient_checkpointing and all(
        b.gradient_checkpointing for b in model.blocks
    )
    model.set_gradient_checkpointing(False)
    assert not any(b.gradient_checkpointing for b in model.blocks)


def test_dropout_is_active_in_training_only():
    model = small(dropout=0.5)
    ids = tokens()
    torch.manual_seed(0)
    a = model(ids)["logits"]
    b = model(ids)["logits"]
    assert not torch.allclose(a, b)
    model.eval()
    torch.testing.assert_close(model(ids)["logits"], model(ids)["logits"])


# -- generate and flops --------------------------------------------------------------------


def test_greedy_generate_matches_a_manual_argmax_loop_past_block_size():
    model = small()
    prompt = tokens(2, 4)
    out = model.generate(prompt, 20, temperature=0.0)
    assert out.shape == (2, 24) and torch.equal(out[:, :4], prompt)
    ids = prompt
    for _ in range(20):
        nxt = model(ids[:, -16:])["logits"][:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, nxt], dim=1)
    assert torch.equal(out, ids)
    assert torch.equal(model.generate(prompt, 20, top_k=1), out)  # top-1 sampling is greedy
    assert model.training  # restored after sampling in eval mode


def test_generate_gives_each_module_back_its_own_mode():
    # A part kept in eval mode on purpose (a frozen block's dropout) came out of generate() in
    # training mode: self.train(was_training) switches every submodule.
    model = small(dropout=0.5)
    model.blocks[0].eval()
    model.generate(tokens(1, 4), 2)
    assert model.training and model.blocks[1].training and model.drop.training
    assert not any(module.training for module in model.blocks[0].modules())
    model.eval().generate(tokens(1, 4), 2)
    assert not any(module.training for module in model.modules())


def test_sampling_is_reproducible_with_a_generator_and_respects_top_k():
    model = small()
    prompt = tokens(4, 3)
    a = model.generate(
        prompt, 8, temperature=1.5, top_k=3, generator=torch.Generator().manual_seed(7)
    )
    b = model.generate(
        prompt, 8, temperature=1.5, top_k=3, generator=torch.Generator().manual_seed(7)
    )
    assert torch.equal(a, b)
    first = a[:, 3]
    top3 = model.eval()(prompt)["logits"][:, -1].topk(3).indices
    assert all(first[i] in top3[i] for i in range(4))


@pytest.mark.parametrize("temperature", [1e-30, 1e-300, 5e-324])
def test_a_tiny_positive_temperature_samples_the_likeliest_tokens(temperature):
    # logits / 1e-300 overflow to inf, and softmax of inf is NaN: multinomial used to raise.
    model = small()
    prompt = tokens(2, 4)
    greedy = model.generate(prompt, 6, temperature=0.0)
    sampled = model.generate(
        prompt, 6, temperature=temperature, generator=torch.Generator().manual_seed(0)
    )
    assert torch.equal(sampled, greedy)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(max_new_tokens=-1), "max_new_tokens"),
        (dict(max_new_tokens=1, temperature=-0.1), "temperature"),
        (dict(max_new_tokens=1, top_k=0), "top_k"),
        (dict(max_new_tokens=1, top_k=True), "top_k"),  # a bool is no count
        (dict(max_new_tokens=True), "max_new_tokens"),
        # Compared with 0 these failed as a bare TypeError naming no argument, or sampled at 1.
        (dict(max_new_tokens=1, temperature="0.8"), "temperature must be a finite number >= 0"),
        (dict(max_new_tokens=1, temperature=True), "temperature must be a finite number >= 0"),
    ],
)
def test_generate_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        small().generate(tokens(), **kwargs)


@pytest.mark.parametrize("prompt", [tokens()[0], tokens(2, 0)], ids=["1-d", "empty"])
def test_generate_rejects_a_prompt_that_is_not_batch_by_sequence(prompt):
    # Both used to fail inside the sampling loop as a bare IndexError.
    with pytest.raises(ValueError, match=r"input_ids must be a \(batch, sequence\) prompt"):
        small().generate(prompt, 2)


@pytest.mark.parametrize("bad", [97, -1])
def test_generate_rejects_a_prompt_id_outside_the_vocabulary(bad):
    # It failed in the embedding as a bare IndexError (a device-side assert on a GPU).
    prompt = tokens(2, 4)
    prompt[1, 2] = bad
    with pytest.raises(ValueError, match=f"token id {bad}, outside the model's vocab_size 97"):
        small().generate(prompt, 2)


@pytest.mark.parametrize("bad", [97, -1])
def test_forward_rejects_a_token_id_outside_the_vocabulary_on_the_cpu(bad):
    # The embedding failed as a bare IndexError ("index out of range in self").
    ids = tokens(2, 4)
    ids[0, 1] = bad
    with pytest.raises(ValueError, match=f"token id {bad}, outside the model's vocab_size 97"):
        small()(ids)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bool, torch.uint8])
def test_forward_and_generate_reject_input_ids_that_are_not_integers(dtype):
    # The embedding failed on them as "Expected tensor for argument #1 'indices'" after
    # generate had range-checked the floats.
    ids = tokens(1, 4).to(dtype)
    for call in (lambda: small()(ids), lambda: small().generate(ids, 2)):
        with pytest.raises(ValueError, match=f"input_ids must hold integer token ids, got {dtype}"):
            call()


def test_generate_keeps_the_prompt_dtype():
    prompt = tokens(2, 4).to(torch.int32)
    out = small().generate(prompt, 3, temperature=0.0)
    assert out.dtype == torch.int32  # was promoted to int64
    assert torch.equal(out.long(), small().generate(prompt.long(), 3, temperature=0.0))
    assert small().generate(tokens(0, 4), 2).shape == (0, 6)  # an empty batch stays empty


def test_generate_stops_where_every_row_has_emitted_eos_token_id():
    # transformers' generate stops at the export's eos_token_id; generate ran on past it.
    model = small()
    prompt = tokens(2, 4)
    full = model.generate(prompt, 12, temperature=0.0)
    eos = int(full[0, 6])  # one of row 0's new tokens
    out = model.generate(prompt, 12, temperature=0.0, eos_token_id=eos)
    ends = [next((t for t in range(4, 16) if full[row, t] == eos), 15) for row in range(2)]
    assert out.size(1) == max(ends) + 1
    for row, end in enumerate(ends):  # as far as its eos, the row is the greedy one
        assert torch.equal(out[row, : end + 1], full[row, : end + 1])
        assert (out[row, end + 1 :] == eos).all()  # a finished row is padded with eos
    one = model.generate(prompt[:1], 12, temperature=0.0, eos_token_id=eos)
    assert torch.equal(one[0], full[0, : ends[0] + 1])  # a single prompt ends on its eos
    assert small().generate(tokens(0, 4), 2, eos_token_id=eos).shape == (0, 6)
    with pytest.raises(ValueError, match="eos_token_id must be None or an id below 97"):
        model.generate(prompt, 2, eos_token_id=97)


def test_generate_puts_each_token_to_a_streamer_as_it_is_sampled():
    # sample printed nothing until every token was generated: generate had no streaming hook.
    class Recorder:
        def __init__(self):
            self.puts, self.ended = [], False

        def put(self, ids):
            assert not self.ended and ids.device.type == "cpu"
            self.puts.append(ids.clone())

        def end(self):
            self.ended = True

    model = small()
    prompt = tokens(2, 4)
    streamer = Recorder()
    out = model.generate(prompt, 6, temperature=0.0, streamer=streamer)
    assert torch.equal(out, model.generate(prompt, 6, temperature=0.0)) and streamer.ended
    assert torch.equal(streamer.puts[0], prompt)  # the prompt first, as transformers does
    assert torch.equal(torch.stack(streamer.puts[1:], dim=1), out[:, 4:])  # then (B,) a step


def test_flops_per_token_follows_palm():
    model = small()
    cfg = model.config
    n = sum(p.numel() for p in model.parameters())
    assert (
        model.flops_per_token()
        == 6 * n + 12 * cfg.n_layer * cfg.n_head * cfg.head_dim * cfg.block_size
    )
    assert model.flops_per_token(8) == 6 * n + 12 * 2 * 4 * 8 * 8
    # Untying adds a lookup table that does no matmul: the head is counted either way, once.
    assert small(tie_weights=False).flops_per_token() == model.flops_per_token()


# -- incremental decoding (KVCache) ---------------------------------------------------------


def _positions_computed(model: ReferenceTransformer) -> list[int]:
    """Record the sequence length of every forward call of model."""
    lengths: list[int] = []
    model.register_forward_pre_hook(
        lambda _, args, kwargs: lengths.append(args[0].size(1)), with_kwargs=True
    )
    return lengths


@pytest.mark.parametrize(
    "n_kv_head, sampling",
    [(4, dict(temperature=0.0)), (2, dict(temperature=1.0)), (1, dict(temperature=1.5, top_k=3))],
    ids=["mha-greedy", "gqa-sampled", "mqa-top-k"],
)
def test_cached_generate_gives_the_tokens_of_recomputing_the_window(n_kv_head, sampling):
    # 4 prompt tokens + 20 new ones run past block_size 16: the window slides for the last 8.
    model = small(n_kv_head=n_kv_head)
    prompt = tokens(3, 4)

    def run(use_cache: bool) -> torch.Tensor:
        generator = torch.Generator().manual_seed(5)
        return model.generate(prompt, 20, **sampling, generator=generator, use_cache=use_cache)

    assert torch.equal(run(True), run(False))


def test_generate_decodes_one_position_per_token_while_the_window_fits():
    # Every token recomputed the whole window: 4, 5, ..., 16, then 16 per token once it slides.
    model = small()
    lengths = _positions_computed(model)
    out = model.generate(tokens(2, 4), 20, temperature=0.0)
    assert lengths == [4] + [1] * 12 + [16] * 7  # the prompt, then one position per token
    assert torch.equal(out, model.generate(tokens(2, 4), 20, temperature=0.0, use_cache=False))
    lengths.clear()
    model.generate(tokens(2, 20), 3, temperature=0.0)  # a prompt past the window never caches
    assert lengths == [16] * 3


def test_a_forward_that_drops_kv_cache_still_generates_the_window_tokens():
    # A subclass whose forward passes only the 2.0 arguments on keeps the recomputing path.
    class Legacy(ReferenceTransformer):
        def forward(self, input_ids, labels=None, attention_mask=None, **_):
            return super().forward(input_ids, labels, attention_mask)

    torch.manual_seed(0)
    legacy = Legacy(**SMALL)
    out = legacy.generate(tokens(2, 4), 20, temperature=0.0)
    assert torch.equal(out, small().generate(tokens(2, 4), 20, temperature=0.0, use_cache=False))


def test_a_forward_without_kv_cache_or_keywords_generates_without_a_cache():
    # Its forward takes only its own arguments: passing kv_cache= raised a TypeError.
    class Strict(ReferenceTransformer):
        def forward(self, input_ids, labels=None, attention_mask=None):
            return super().forward(input_ids, labels, attention_mask)

    torch.manual_seed(0)
    strict = Strict(**SMALL)
    out = strict.generate(tokens(2, 4), 20, temperature=0.0)
    assert torch.equal(out, small().generate(tokens(2, 4), 20, temperature=0.0, use_cache=False))


def test_kv_cache_forward_gives_the_full_forward_logits():
    model = small().eval()
    ids = tokens(2, 16)
    full = model(ids)["logits"]
    cache = KVCache(16)
    steps = [model(ids[:, :5], kv_cache=cache)["logits"]]
    steps += [model(ids[:, t : t + 1], kv_cache=cache)["logits"] for t in range(5, 16)]
    assert cache.length == 16
    torch.testing.assert_close(torch.cat(steps, dim=1), full)
    with pytest.raises(ValueError, match=r"kv_cache is full \(16 of block_size 16"):
        model(ids[:, :1], kv_cache=cache)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda m, c: m(tokens(2, 4), kv_cache=KVCache(8)), "pass KVCache\\(model.config"),
        (lambda m, c: m(tokens(2, 4), labels=tokens(2, 4), kv_cache=c), "pass no labels"),
        (lambda m, c: (m(tokens(2, 4), kv_cache=c), m(tokens(2, 2), kv_cache=c)), "one more"),
    ],
)
def test_kv_cache_misuse_is_a_one_line_error(call, message):
    with pytest.raises(ValueError, match=message):
        call(small().eval(), KVCache(16))


@pytest.mark.parametrize(
    "continued_by",
    [
        lambda m: small(n_kv_head=1).eval()(tokens(2, 1), kv_cache=m),  # ran silently
        lambda m: small(n_layer=3).eval()(tokens(2, 1), kv_cache=m),  # read unwritten keys
        lambda m: small().eval()(tokens(1, 1), kv_cache=m),
        lambda m: small().eval().to(torch.bfloat16)(tokens(2, 1), kv_cache=m),
    ],
    ids=["fewer-kv-heads", "more-layers", "other-batch", "other-dtype"],
)
def test_a_kv_cache_continued_by_another_model_or_batch_is_a_one_line_error(continued_by):
    cache = KVCache(16)
    small().eval()(tokens(2, 4), kv_cache=cache)
    with pytest.raises(ValueError, match=r"^kv_cache holds .* start a new KVCache") as caught:
        continued_by(cache)
    assert "\n" not in str(caught.value)


def test_top_k_keeps_the_tokens_tied_with_the_kth_as_transformers_does():
    # Not a defect: transformers' TopKLogitsWarper keeps every logit >= the k-th, ties included.
    transformers = pytest.importorskip("transformers")
    from speedtronic_model.model import _sample

    logits = torch.tensor([[5.0, 3.0, 3.0, 3.0, 1.0]]).expand(256, 5)
    warped = transformers.TopKLogitsWarper(2)(None, logits)
    theirs = set(torch.nonzero(warped[0].isfinite()).flatten().tolist())
    ours = set(_sample(logits, 1.0, 2, torch.Generator().manual_seed(0)).flatten().tolist())
    assert ours == theirs == {0, 1, 2, 3}


@pytest.mark.parametrize("use_cache", [True, False])
def test_generate_a_left_padded_batch_gives_each_prompt_alone(use_cache):
    # transformers' generate(input_ids, attention_mask=) of a tokenizer's padded batch: generate
    # had no attention_mask, so a shorter prompt's pads were read as tokens (or a TypeError).
    model = small()
    with torch.no_grad():  # at init the next token barely depends on the context: make it matter
        for name, param in model.named_parameters():
            if "norm" not in name:
                param.mul_(10)
    short, long = tokens(1, 3, seed=2), tokens(1, 6, seed=3)
    padded = torch.cat((torch.cat((torch.zeros(1, 3, dtype=torch.long), short), 1), long))
    mask = torch.ones_like(padded)
    mask[0, :3] = 0
    alone = model.generate(short, 14, temperature=0.0)[0]
    assert not torch.equal(model.generate(padded, 14, temperature=0.0)[0, 3:], alone)  # pads read
    # 14 new tokens: both rows slide past block_size 16 (alone, the short one a step later).
    out = model.generate(padded, 14, temperature=0.0, attention_mask=mask, use_cache=use_cache)
    assert torch.equal(out[0, 3:], alone)
    assert torch.equal(out[1], model.generate(long, 14, temperature=0.0)[0])


def test_kv_cache_forward_with_a_padding_mask_gives_the_full_forward_logits():
    model = small().eval()
    ids, mask = tokens(2, 10), torch.ones(2, 10, dtype=torch.long)
    mask[0, :4] = 0
    full = model(ids, attention_mask=mask)["logits"]
    cache = KVCache(16)
    steps = [model(ids[:, :6], attention_mask=mask[:, :6], kv_cache=cache)["logits"]]
    steps += [
        model(ids[:, t : t + 1], attention_mask=mask[:, : t + 1], kv_cache=cache)["logits"]
        for t in range(6, 10)
    ]
    torch.testing.assert_close(torch.cat(steps, dim=1), full)
    with pytest.raises(ValueError, match=r"attention_mask shape \(2, 1\) != \(2, 11\)"):
        model(ids[:, :1], attention_mask=mask[:, :1], kv_cache=cache)


@pytest.mark.parametrize(
    "mask, message",
    [
        (torch.tensor([[1, 1, 0], [1, 1, 1]]), "attention_mask must pad on the left"),
        (torch.tensor([[0, 0, 0], [1, 1, 1]]), "attention_mask must pad on the left"),
        (torch.ones(2, 2, dtype=torch.long), r"attention_mask shape \(2, 2\) != input_ids"),
    ],
)
def test_generate_rejects_a_mask_it_cannot_continue(mask, message):
    # A right-padded row would continue after its pads; an all-padding row is an empty prompt.
    with pytest.raises(ValueError, match=message):
        small().generate(tokens(2, 3), 2, attention_mask=mask)


@pytest.mark.parametrize("chunk", [None, 4])
@pytest.mark.parametrize("bad", [97, -1, -101])
def test_forward_rejects_a_label_outside_the_vocabulary_on_the_cpu(bad, chunk):
    # cross_entropy failed as "IndexError: Target 97 is out of bounds." (chunked: "index 97 is
    # out of bounds for dimension 1 with size 97"); -100 stays the ignored label.
    labels = tokens(2, 4)
    labels[0, 0], labels[1, 3] = -100, bad
    message = f"labels hold token id {bad}, outside the model's vocab_size 97"
    with pytest.raises(ValueError, match=message):
        small(loss_chunk_size=chunk)(tokens(2, 4), labels=labels)


@pytest.mark.parametrize("chunk", [None, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bool])
def test_forward_rejects_labels_that_are_not_integers(dtype, chunk):
    # Floats failed as "expected target dtype to be Long or Byte, but got Float" and, with
    # loss_chunk_size, were truncated to ids; bools were taken as ids 0 and 1.
    labels = tokens(2, 4).to(dtype)
    message = f"labels must hold integer token ids \\(-100 to ignore\\), got {dtype}"
    with pytest.raises(ValueError, match=message):
        small(loss_chunk_size=chunk)(tokens(2, 4), labels=labels)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16, torch.int32, torch.long])
def test_forward_takes_labels_of_any_integer_dtype(dtype):
    model, ids = small(), tokens(2, 4)
    labels = tokens(2, 4, seed=5)
    expected = model(ids, labels=labels)["loss"]
    torch.testing.assert_close(model(ids, labels=labels.to(dtype))["loss"], expected)
    labels[0] = -100
    if dtype != torch.uint8:
        torch.testing.assert_close(
            model(ids, labels=labels.to(dtype))["loss"], model(ids, labels=labels)["loss"]
        )


def test_forward_leaves_the_label_values_unread_while_compiling(monkeypatch):
    # Reading them would break the graph (as reading the ids would): the loss's own error stands.
    labels = tokens(2, 4)
    labels[0, 0] = 97
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    with pytest.raises(IndexError, match="Target 97 is out of bounds"):
        small()(tokens(2, 4), labels=labels)


def test_generate_takes_numpy_integer_counts():
    np = pytest.importorskip("numpy")
    # Refused as "max_new_tokens must be an integer >= 0, got np.int64(3)" (also top_k, eos).
    prompt = tokens(2, 4)
    expected = small().generate(prompt, 3, temperature=0.0, top_k=5, eos_token_id=7)
    counts = dict(top_k=np.int64(5), eos_token_id=np.int32(7))
    out = small().generate(prompt, np.int64(3), temperature=0.0, **counts)
    assert torch.equal(out, expected)


@pytest.mark.parametrize("temperature", [math.inf, math.nan])
def test_generate_rejects_a_temperature_that_is_not_finite(temperature):
    # inf sampled every token uniformly (the logits all divided to 0).
    message = f"temperature must be a finite number >= 0 .*, got {temperature}"
    with pytest.raises(ValueError, match=message):
        small().generate(tokens(), 1, temperature=temperature)
