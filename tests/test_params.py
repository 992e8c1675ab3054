"""purelayers.params basics: names, flatten/unflatten, count, load_state_dict, summary."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import purelayers as pl
from purelayers import layers as L


def model():
    return L.Sequential(L.Linear(4), L.ReLU(), L.Linear(2))


def test_flatten_unflatten_roundtrip():
    params = model().init(jax.random.key(0), (1, 3))
    flat = pl.params.flatten(params)
    assert list(flat) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    back = pl.params.unflatten(flat)
    assert jax.tree.structure(back) == jax.tree.structure(params)
    pl.testing.assert_tree_allclose(back, params, rtol=0, atol=0)
    assert pl.params.flatten({"a": [jnp.ones(1), {"b": jnp.ones(2)}]}).keys() == {"a.0", "a.1.b"}
    with pytest.raises(ValueError, match=r"unflatten: 'a\.b' needs 'a' to be a group"):
        pl.params.unflatten({"a": 1, "a.b": 2})


def test_merge_places_a_buffer_only_child_at_its_index(torch):
    """A ``Sequential`` child with buffers and no parameters (``BatchNorm1d(affine=False)``
    at index 1) lists between children 0 and 3, as torch's ``state_dict()``, without a
    model to order by; named children keep ``params``' order."""
    nn = torch.nn
    model = L.Sequential(
        L.Linear(4), L.BatchNorm1d(affine=False), L.ReLU(), L.Linear(3), L.BatchNorm1d()
    )
    params, state = model.init(jax.random.key(0), (2, 5)), model.init_state((2, 5))
    twin = nn.Sequential(
        nn.Linear(5, 4),
        nn.BatchNorm1d(4, affine=False),
        nn.ReLU(),
        nn.Linear(4, 3),
        nn.BatchNorm1d(3),
    )
    assert list(pl.params.flatten(pl.params.merge(params, state))) == list(twin.state_dict())
    one, zero = jnp.ones(1), jnp.zeros(1)
    merged = pl.params.merge(
        {"b": {"w": one}, "a": {"w": one}}, {"c": {"m": zero}, "a": {"m": zero}}
    )
    assert list(pl.params.flatten(merged)) == ["b.w", "a.w", "a.m", "c.m"]


def test_count():
    """Linear(3 -> 4): 12 + 4; Linear(4 -> 2): 8 + 2; total 26."""
    assert pl.params.count(model().init(jax.random.key(0), (1, 3))) == 26


def test_load_state_dict_from_torch_and_numpy(torch):
    module = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    template = model().init(jax.random.key(0), (1, 3))
    loaded = pl.params.load_state_dict(template, module.state_dict())
    np.testing.assert_array_equal(loaded["0"]["weight"], module[0].weight.detach().numpy())
    as_numpy = {k: v.numpy().astype(np.float64) for k, v in module.state_dict().items()}
    loaded64 = pl.params.load_state_dict(template, as_numpy)
    assert loaded64["2"]["bias"].dtype == jnp.float32  # cast to the template's dtype
    bf16 = {k: v.to(torch.bfloat16) for k, v in module.state_dict().items()}
    loaded_bf16 = pl.params.load_state_dict(template, bf16)
    np.testing.assert_allclose(
        loaded_bf16["0"]["weight"], module[0].weight.detach().numpy(), rtol=1e-2
    )
    # into a bfloat16 template: the same bits (read through an int16 view, no float32
    # copy), owned by the loaded array (changing the tensor afterwards changes nothing)
    template16 = model().init(jax.random.key(0), (1, 3), jnp.bfloat16)
    exact = pl.params.load_state_dict(template16, bf16)
    want = bf16["0.weight"].view(torch.int16).numpy().copy()
    np.testing.assert_array_equal(np.asarray(exact["0"]["weight"]).view(np.int16), want)
    bf16["0.weight"].add_(1.0)
    np.testing.assert_array_equal(np.asarray(exact["0"]["weight"]).view(np.int16), want)


def test_load_state_dict_strict_errors_change_nothing():
    template = model().init(jax.random.key(0), (1, 3))
    before = jax.tree.map(np.array, template)
    flat = dict(pl.params.flatten(template))
    del flat["0.bias"], flat["2.weight"]
    flat["3.weight"] = np.zeros((2, 4))
    flat["extra"] = np.zeros(1)
    with pytest.raises(KeyError) as info:
        pl.params.load_state_dict(template, flat)
    message = str(info.value)
    for name in ("0.bias", "2.weight", "3.weight", "extra"):
        assert name in message
    pl.testing.assert_tree_allclose(template, before, rtol=0, atol=0)
    with pytest.warns(pl.params.CheckpointWarning, match=r"0\.bias.*2\.weight"):
        partial = pl.params.load_state_dict(template, {"0.weight": np.ones((4, 3))}, strict=False)
    assert (partial["0"]["weight"] == 1).all()
    np.testing.assert_array_equal(partial["2"]["weight"], before["2"]["weight"])


def test_load_state_dict_shape_mismatch_names_each():
    template = model().init(jax.random.key(0), (1, 3))
    flat = dict(pl.params.flatten(template))
    flat["0.weight"] = np.zeros((4, 5))
    flat["2.bias"] = np.zeros(3)
    with pytest.raises(
        ValueError,
        match=r"0\.weight: expected \(4, 3\), got \(4, 5\).*2\.bias: expected \(2,\), got \(3,\)",
    ):
        pl.params.load_state_dict(template, flat)


def test_summary_lists_torch_order_for_sorted_trees():
    net = L.Sequential(*[L.Linear(2) for _ in range(11)])
    params = jax.jit(lambda p: p)(net.init(jax.random.key(0), (1, 2)))
    table = pl.params.summary(net, params)
    lines = table.splitlines()
    assert lines[0].split() == ["name", "shape", "dtype", "count", "kind"]
    names = [line.split()[0] for line in lines[2:-2]]
    assert names[:4] == ["0.weight", "0.bias", "1.weight", "1.bias"] and names[-1] == "10.bias"
    assert "total: 66 trainable parameters" in lines[-1]
