from __future__ import annotations

import pytest
import torch

from speedtronic_diloco.tensors import (
    DeltaRef,
    average_deltas,
    check_node_id,
    compute_pseudo_gradient,
    cpu_state_dict,
    delta_path,
    delta_problem,
    floating_state,
    load_delta,
    load_safetensors,
    metadata_json,
    parse_delta_ref,
    read_metadata,
    save_safetensors,
    state_nbytes,
)


class Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(7, 4)
        self.head = torch.nn.Linear(4, 7, bias=False)
        self.head.weight = self.emb.weight
        self.register_buffer("count", torch.tensor(3, dtype=torch.long))


def test_tied_model_state_can_be_safetensors_serialized(tmp_path):
    model = Tied()
    path = tmp_path / "m.safetensors"
    save_safetensors(model.state_dict(), path, metadata={"k": "v"})
    loaded = load_safetensors(path)
    assert set(loaded) == {"emb.weight", "head.weight", "count"}
    assert torch.equal(loaded["emb.weight"], model.emb.weight) and torch.equal(
        loaded["head.weight"], model.emb.weight
    )
    assert read_metadata(path) == {"k": "v"}
    assert not list(tmp_path.glob("*.tmp"))


def test_cpu_state_dict_is_independent():
    model = Tied()
    copy = cpu_state_dict(model.state_dict())
    copy["emb.weight"].add_(1.0)
    assert not torch.equal(copy["emb.weight"], model.emb.weight)
    assert copy["head.weight"].data_ptr() != copy["emb.weight"].data_ptr()


def test_pseudo_gradient_direction_and_average():
    baseline = {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor([1])}
    current = {"w": torch.tensor([0.5, 3.0]), "n": torch.tensor([5])}
    delta = compute_pseudo_gradient(baseline, current)
    assert set(delta) == {"w"}  # integer buffers never get deltas
    assert torch.equal(delta["w"], torch.tensor([0.5, -1.0]))  # baseline - current
    avg = average_deltas([delta, {"w": torch.tensor([1.5, 1.0])}])
    assert torch.equal(avg["w"], torch.tensor([1.0, 0.0]))


def test_pseudo_gradient_rejects_missing_tensor():
    with pytest.raises(KeyError, match="lacks baseline tensors"):
        compute_pseudo_gradient({"w": torch.ones(2)}, {})


def test_average_rejects_mismatched_names_and_empty():
    with pytest.raises(ValueError, match="at least one"):
        average_deltas([])
    with pytest.raises(ValueError, match="different tensor names"):
        average_deltas([{"a": torch.ones(1)}, {"b": torch.ones(1)}])


def test_average_keeps_bf16_dtype_with_float32_accumulation():
    deltas = [{"w": torch.full((3,), 1.0 + i * 2**-8, dtype=torch.bfloat16)} for i in range(3)]
    out = average_deltas(deltas)["w"]
    assert out.dtype == torch.bfloat16
    expected = torch.stack([d["w"].float() for d in deltas]).mean(0).bfloat16()
    assert torch.equal(out, expected)


def test_delta_path_parser():
    path = delta_path("node-1", 1500, 7)
    assert parse_delta_ref(path) == DeltaRef("node-1", 1500, 7)
    assert DeltaRef("node-1", 1500, 7).path == path
    for bad in [
        "global/model.safetensors",
        "deltas/a/b/step-1-base-1.safetensors",
        "deltas/../step-1-base-1.safetensors",
        "deltas/n/step-x-base-1.safetensors",
        "deltas/n/step-1-base-1.bin",
    ]:
        assert parse_delta_ref(bad) is None


@pytest.mark.parametrize("node", ["", "a/b", "..", "a b", None])
def test_unsafe_node_ids_are_rejected(node):
    with pytest.raises(ValueError, match="path-safe"):
        check_node_id(node)


def test_delta_problem_reasons():
    ref = {"w": torch.zeros(2, 3), "b": torch.zeros(3), "n": torch.tensor([1])}
    good = {"w": torch.ones(2, 3), "b": torch.ones(3)}
    assert delta_problem(good, ref) is None
    assert "names differ" in delta_problem({"w": torch.ones(2, 3)}, ref)
    assert "shape" in delta_problem({**good, "w": torch.ones(3, 2)}, ref)
    assert "dtype" in delta_problem({**good, "b": torch.ones(3, dtype=torch.float64)}, ref)
    assert "non-finite" in delta_problem({**good, "b": torch.tensor([0.0, float("nan"), 1.0])}, ref)
    assert "non-finite" in delta_problem({**good, "b": torch.tensor([0.0, float("inf"), 1.0])}, ref)


def test_load_delta_and_metadata_json(tmp_path):
    path = tmp_path / "d.safetensors"
    save_safetensors(
        {"w": torch.ones(2)}, path, metadata={"n": "3", "name": "node", "obj": '{"a": 1}'}
    )
    tensors, meta = load_delta(path)
    assert torch.equal(tensors["w"], torch.ones(2))
    assert metadata_json(meta) == {"n": 3, "name": "node", "obj": {"a": 1}}


def test_state_nbytes_counts_floating_payload():
    assert (
        state_nbytes(
            {
                "w": torch.zeros(4, dtype=torch.float32),
                "h": torch.zeros(2, dtype=torch.float16),
                "n": torch.zeros(9, dtype=torch.long),
            }
        )
        == 20
    )
    assert floating_state({"n": torch.zeros(1, dtype=torch.long)}) == {}


def test_identical_deltas_groups_equal_deltas_only():
    from speedtronic_diloco.tensors import identical_deltas

    deltas = {
        "a": {"w": torch.tensor([1.0, 2.0]), "b": torch.ones(1)},
        "b": {"w": torch.tensor([2.0, 1.0]), "b": torch.ones(1)},  # the same sums, not equal
        "c": {"w": torch.tensor([1.0, 2.0]), "b": torch.ones(1)},
        "d": {"w": torch.tensor([2.0, 1.0]), "b": torch.ones(1)},
        "e": {"w": torch.tensor([1.0, 2.0])},  # another set of tensors
    }
    assert identical_deltas(deltas) == [["a", "c"], ["b", "d"]]
    assert identical_deltas({"a": deltas["a"]}) == []
