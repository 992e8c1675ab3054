"""Checkpoint files: PyTorch loads what we save and we load what it saves; atomic writes;
clear errors for damaged files; strict and non-strict loading; sharding; renaming."""

from __future__ import annotations

import json
import os
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import purelayers as pl
from purelayers import _safetensors_io as _io
from purelayers import layers as L
from purelayers.params import (
    PURELAYERS_TO_TORCH_MHA,
    TORCH_MHA_TO_PURELAYERS,
    CheckpointError,
    CheckpointWarning,
    IncompatibleKeys,
    flatten,
    load,
    load_into,
    load_metadata,
    load_state_dict,
    rename,
    save,
    summary,
    unflatten,
)

st = pytest.importorskip("safetensors.torch")


def _mlp():
    return L.Sequential(L.Linear(8), L.ReLU(), L.Linear(3))


def _torch_mlp(torch):
    nn = torch.nn
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def _x(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.fixture
def mlp_file(tmp_path):
    params = _mlp().init(jax.random.key(0), (2, 4))
    path = tmp_path / "mlp.safetensors"
    save(path, params)
    return path, params


def _error_names(path):
    return re.escape(os.fspath(path))


# -- PyTorch both ways ------------------------------------------------------------------


def test_mlp_saved_file_loads_into_torch_with_equal_outputs(torch, tmp_path):
    model = _mlp()
    params = model.init(jax.random.key(1), (2, 4))
    path = save(tmp_path / "mlp.safetensors", params)
    module = _torch_mlp(torch)
    module.load_state_dict(st.load_file(path), strict=True)
    x = _x(5, 4)
    np.testing.assert_allclose(
        np.asarray(model.apply(params, jnp.asarray(x))),
        module(torch.tensor(x)).detach().numpy(),
        rtol=1e-6,
        atol=1e-6,
    )


def test_mlp_torch_file_loads_into_purelayers_with_equal_outputs_and_gradients(torch, tmp_path):
    module = _torch_mlp(torch)
    st.save_file(module.state_dict(), tmp_path / "torch.safetensors")
    model = _mlp()
    template = model.init(jax.random.key(0), (2, 4))
    params = load_into(tmp_path / "torch.safetensors", template)
    assert not np.array_equal(params["0"]["weight"], template["0"]["weight"])
    pl.testing.assert_matches_torch(model, module, _x(5, 4), params=params)


def test_load_lists_names_in_torch_order_and_keeps_values(mlp_file, torch):
    path, params = mlp_file
    loaded = load(path)
    assert list(loaded) == list(_torch_mlp(torch).state_dict()) == list(flatten(params))
    for name, value in flatten(params).items():
        np.testing.assert_array_equal(loaded[name], value)
        assert loaded[name].dtype == value.dtype


def test_save_lists_a_key_sorted_tree_in_the_models_order(tmp_path):
    model = L.Sequential(*[L.Linear(3) for _ in range(11)])
    trained = jax.jit(lambda p: p)(model.init(jax.random.key(0), (1, 2)))
    as_given = save(tmp_path / "a.safetensors", trained)
    assert list(load(as_given))[:3] == ["0.bias", "0.weight", "1.bias"]
    ordered = save(tmp_path / "b.safetensors", trained, model=model)
    assert list(load(ordered)) == [f"{i}.{n}" for i in range(11) for n in ("weight", "bias")]


def test_bfloat16_round_trip_is_exact_and_torch_reads_bfloat16(torch, tmp_path):
    params = _mlp().init(jax.random.key(0), (2, 4), jnp.bfloat16)
    path = save(tmp_path / "bf16.safetensors", params)
    loaded = load(path)
    for name, value in flatten(params).items():
        assert loaded[name].dtype == jnp.bfloat16
        np.testing.assert_array_equal(
            np.asarray(loaded[name], np.float32), np.asarray(value, np.float32)
        )
    from_torch = st.load_file(path)
    assert from_torch["0.weight"].dtype == torch.bfloat16
    np.testing.assert_array_equal(
        from_torch["0.weight"].float().numpy(), np.asarray(params["0"]["weight"], np.float32)
    )
    # and back: a torch-written bfloat16 file
    st.save_file(from_torch, tmp_path / "back.safetensors")
    again = load_into(tmp_path / "back.safetensors", params)
    assert again["2"]["bias"].dtype == jnp.bfloat16
    np.testing.assert_array_equal(
        np.asarray(again["2"]["bias"], np.float32), np.asarray(params["2"]["bias"], np.float32)
    )


def test_step_counters_are_written_as_int64_and_read_back_as_the_template_dtype(torch, tmp_path):
    params = {"bn": {"weight": jnp.ones(3), "bias": jnp.zeros(3)}}
    state = {
        "bn": {
            "running_mean": jnp.zeros(3),
            "running_var": jnp.ones(3),
            "num_batches_tracked": jnp.asarray(7, jnp.int32),
        }
    }
    path = save(tmp_path / "bn.safetensors", params, state)
    sd = st.load_file(path)
    assert sd["bn.num_batches_tracked"].dtype == torch.int64
    assert int(sd["bn.num_batches_tracked"]) == 7
    assert list(load(path)) == [
        "bn.weight",
        "bn.bias",
        "bn.running_mean",
        "bn.running_var",
        "bn.num_batches_tracked",
    ]
    module = torch.nn.ModuleDict({"bn": torch.nn.BatchNorm1d(3)})
    module.load_state_dict(sd, strict=True)
    p2, s2 = load_into(path, params, state)
    assert s2["bn"]["num_batches_tracked"].dtype == jnp.int32
    assert int(s2["bn"]["num_batches_tracked"]) == 7
    np.testing.assert_array_equal(p2["bn"]["weight"], params["bn"]["weight"])


def test_metadata_is_stored_in_the_header_and_validated(tmp_path, mlp_file):
    path, params = mlp_file
    save(path, params, metadata={"epoch": "3", "format": "pt"})
    assert load_metadata(path) == {"format": "pt", "epoch": "3"}
    with pytest.raises(ValueError, match=r"save: metadata must map str to str, got 'epoch': 3"):
        save(path, params, metadata={"epoch": 3})
    with pytest.raises(ValueError, match=r"save: metadata must be a dict"):
        save(path, params, metadata=["epoch"])
    assert load_metadata(path) == {"format": "pt", "epoch": "3"}  # failed saves wrote nothing


def test_save_rejects_folders_bad_shard_sizes_and_unstorable_dtypes(tmp_path, mlp_file):
    _, params = mlp_file
    with pytest.raises(ValueError, match=r"is a folder; pass a file name"):
        save(tmp_path, params)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match=r"max_shard_bytes must be a positive int"):
            save(tmp_path / "s", params, max_shard_bytes=bad)
    with pytest.raises(ValueError, match=r"save: 'w' has dtype int4, which safetensors cannot"):
        save(tmp_path / "k.safetensors", {"w": jnp.zeros(2, jnp.int4)})
    with pytest.raises(ValueError, match=r"'w' is both a parameter and a buffer"):
        save(tmp_path / "k.safetensors", {"w": jnp.ones(2)}, {"w": jnp.ones(2)})


# -- atomic writes ----------------------------------------------------------------------


class _Crash(BaseException):
    """Stands for a crash or Ctrl-C in the middle of writing."""


def _crash_on_call(module, name, n, *, half_written=False):
    """``module.name`` that raises ``_Crash`` on its ``n``-th call; with ``half_written``
    that call first writes its file (the serializer's first argument is the tensors,
    its second the file name) and cuts it in half, as a crash mid-write leaves it."""
    real, calls = getattr(module, name), []

    def crash(*args, **kwargs):
        calls.append(1)
        if len(calls) < n:
            return real(*args, **kwargs)
        if half_written:
            real(*args, **kwargs)
            with open(args[1], "r+b") as f:
                f.truncate(os.fstat(f.fileno()).st_size // 2)
        raise _Crash

    return crash


@pytest.mark.parametrize(
    "where", ["while fetching tensors", "while writing tensors", "in fsync", "in the rename"]
)
def test_a_failed_save_leaves_the_earlier_file_intact_and_no_temporary(
    monkeypatch, mlp_file, where
):
    path, params = mlp_file
    before = path.read_bytes()
    if where == "while fetching tensors":
        monkeypatch.setattr(_io, "host_bytes", _crash_on_call(_io, "host_bytes", 2))
    elif where == "while writing tensors":
        crash = _crash_on_call(_io.safetensors, "serialize_file", 1, half_written=True)
        monkeypatch.setattr(_io.safetensors, "serialize_file", crash)
    elif where == "in fsync":
        monkeypatch.setattr(_io.os, "fsync", lambda fd: (_ for _ in ()).throw(_Crash()))
    else:
        monkeypatch.setattr(_io.os, "replace", lambda a, b: (_ for _ in ()).throw(_Crash()))
    newer = jax.tree.map(lambda a: a + 1, params)
    with pytest.raises(_Crash):
        save(path, newer)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert sorted(os.listdir(path.parent)) == [path.name]
    np.testing.assert_array_equal(load(path)["2.bias"], params["2"]["bias"])


def test_a_failed_sharded_save_leaves_the_earlier_checkpoint_intact(monkeypatch, tmp_path):
    params = _mlp().init(jax.random.key(0), (2, 4))
    save(tmp_path, params, max_shard_bytes=64)
    before = {f: (tmp_path / f).read_bytes() for f in os.listdir(tmp_path)}
    crash = _crash_on_call(_io.safetensors, "serialize_file", 3, half_written=True)
    monkeypatch.setattr(_io.safetensors, "serialize_file", crash)
    with pytest.raises(_Crash):
        save(tmp_path, jax.tree.map(lambda a: a + 1, params), max_shard_bytes=64)
    monkeypatch.undo()
    assert len(before) > 3  # the crash came after two shards were written
    assert {f: (tmp_path / f).read_bytes() for f in os.listdir(tmp_path)} == before
    np.testing.assert_array_equal(load(tmp_path)["0.weight"], params["0"]["weight"])


# -- damaged files ----------------------------------------------------------------------


def _header_end(data: bytes) -> int:
    return 8 + int.from_bytes(data[:8], "little")


def test_truncated_files_raise_a_checkpoint_error_naming_the_file(mlp_file):
    path, _ = mlp_file
    data = path.read_bytes()
    end = _header_end(data)
    for cut in sorted({0, 3, 8, 9, end // 2, end - 1, end, end + 5, len(data) - 1}):
        path.write_bytes(data[:cut])
        with pytest.raises(CheckpointError, match=_error_names(path)) as info:
            load(path)
        assert info.value.path == os.fspath(path)
        assert re.search(r"truncated|not a safetensors file|corrupted", str(info.value))
    for damaged in (data[: len(data) - 4], data + b"\0" * 4):  # short, or extra bytes
        path.write_bytes(damaged)
        with pytest.raises(
            CheckpointError,
            match=_error_names(path) + r": truncated or corrupted: its tensor data does not "
            r"fill the file as the header describes \(safetensors: .*not fully covered\)",
        ):
            load(path)


@pytest.mark.parametrize("size", [0, 5, 64, 4096])
def test_random_bytes_raise_a_checkpoint_error(tmp_path, size):
    path = tmp_path / "noise.safetensors"
    for seed in range(5):
        path.write_bytes(np.random.default_rng(seed).bytes(size))
        with pytest.raises(CheckpointError, match=_error_names(path)):
            load(path)


def test_a_torch_save_zip_is_recognised(torch, tmp_path):
    path = tmp_path / "model.pt"
    torch.save(_torch_mlp(torch).state_dict(), path)
    with pytest.raises(CheckpointError, match=r"zip archive: a torch.save file\?"):
        load(path)


def test_every_single_bit_flip_in_the_header_is_caught_or_harmless(mlp_file):
    """A flipped bit either raises ``CheckpointError`` naming the file, or only renames a
    tensor or changes the metadata (the name order included): every value comes back
    unchanged, under its own name or, for the one renamed tensor, the new name. Nothing
    else escapes, and whatever loads, the reference parser accepts too."""
    import safetensors

    path, params = mlp_file
    data = path.read_bytes()
    original = {k: np.asarray(v) for k, v in flatten(params).items()}
    caught = 0
    for pos in range(_header_end(data)):
        for bit in (0, 3, 6):
            damaged = bytearray(data)
            damaged[pos] ^= 1 << bit
            path.write_bytes(bytes(damaged))
            try:
                loaded = load(path)
            except CheckpointError as e:
                assert os.fspath(path) in str(e)
                caught += 1
                continue
            renamed = [k for k in loaded if k not in original]
            lost = [k for k in original if k not in loaded]
            assert len(loaded) == len(original) and len(renamed) == len(lost) <= 1, (pos, bit)
            for name, value in loaded.items():
                want = original[lost[0]] if name in renamed else original[name]
                np.testing.assert_array_equal(value, want)
                assert value.dtype == want.dtype
            safetensors.deserialize(bytes(damaged))  # the reference parser accepts it too
    assert caught > 0.5 * 3 * _header_end(data)


def test_the_reference_parser_accepts_what_we_write(mlp_file):
    import safetensors

    path, params = mlp_file
    names = [name for name, _ in safetensors.deserialize(path.read_bytes())]
    assert sorted(names) == sorted(flatten(params))


def test_the_name_order_is_kept_in_the_metadata_and_hidden_from_load_metadata(tmp_path):
    """The safetensors package lays the header out by dtype, then name; ``save`` keeps
    the names' own order in the metadata, ``load`` restores it, and a file whose order
    entry does not list exactly its names (written by another tool) loads in layout order."""
    import safetensors
    import safetensors.numpy

    params = {"w": jnp.ones(2), "c": jnp.ones(3, jnp.bfloat16), "n": jnp.zeros((), jnp.int32)}
    params["a"] = jnp.ones(1)
    path = save(tmp_path / "o.safetensors", params, metadata={"step": "1"})
    with safetensors.safe_open(path, framework="numpy") as f:
        assert f.offset_keys() == ["a", "w", "n", "c"]  # F32 by name, I32, then BF16
        assert f.metadata()["purelayers.order"] == '["w","c","n","a"]'
    assert list(load(path)) == ["w", "c", "n", "a"]
    assert load_metadata(path) == {"format": "pt", "step": "1"}
    with pytest.raises(ValueError, match=r"save: metadata key 'purelayers.order' is reserved"):
        save(path, params, metadata={"purelayers.order": "[]"})

    other = tmp_path / "other.safetensors"
    values = {"z": np.ones(2, np.float32), "y": np.zeros(1, np.float64)}
    for order in ('["z"]', '["z","q"]', "not json", "[1, 2]"):
        safetensors.numpy.save_file(values, other, metadata={"purelayers.order": order})
        loaded = load(other)
        assert list(loaded) == ["y", "z"]  # F64 before F32: the package's layout
        np.testing.assert_array_equal(loaded["z"], values["z"])


def test_float8_round_trips_and_dtypes_we_cannot_represent_are_named(tmp_path):
    """float8 in every format torch and safetensors store (e4m3, e5m2, e8m0 scales)
    round-trips; packed 4-bit values are named as what we cannot represent."""
    import ml_dtypes
    import safetensors

    params = {
        "e4m3": jnp.linspace(-2, 2, 5).astype(jnp.float8_e4m3fn),
        "e5m2": jnp.linspace(-2, 2, 5).astype(jnp.float8_e5m2),
        "bf16": jnp.linspace(-2, 2, 5).astype(jnp.bfloat16),
    }
    path = save(tmp_path / "f8.safetensors", params)
    loaded = load(path)
    assert list(loaded) == list(params)
    for name, value in params.items():
        assert loaded[name].dtype == value.dtype
        np.testing.assert_array_equal(
            np.asarray(loaded[name], np.float32), np.asarray(value, np.float32)
        )

    # MX block scales (torch's float8_e8m0fnu, safetensors' F8_E8M0) load as theirs
    scale = np.array([1.0, 2.0, 0.5, 2.0**-20], ml_dtypes.float8_e8m0fnu)
    spec = safetensors.TensorSpec(
        dtype="float8_e8m0fnu", shape=[4], data_ptr=scale.ctypes.data, data_len=scale.nbytes
    )
    safetensors.serialize_file({"scale": spec}, tmp_path / "e8m0.safetensors")
    got = load(tmp_path / "e8m0.safetensors")["scale"]
    assert got.dtype == jnp.float8_e8m0fnu
    np.testing.assert_array_equal(np.asarray(got, np.float32), scale.astype(np.float32))
    # packed 4-bit values (F4: two to a byte) have no NumPy dtype: named, file refused
    header = json.dumps({"p": {"dtype": "F4", "shape": [4], "data_offsets": [0, 2]}}).encode()
    header += b" " * (-len(header) % 8)
    packed = tmp_path / "f4.safetensors"
    packed.write_bytes(len(header).to_bytes(8, "little") + header + b"\x00\x00")
    with pytest.raises(
        CheckpointError,
        match=_error_names(packed) + r": holds dtypes purelayers cannot represent: \{'p': 'F4'\}",
    ):
        load(packed)


# -- strict and non-strict --------------------------------------------------------------


def _with_head(n):
    return L.Sequential(L.Linear(8), L.ReLU(), L.Linear(3), L.ReLU(), L.Linear(n))


def test_strict_names_every_missing_and_unexpected_key_at_once(mlp_file):
    path, _ = mlp_file
    template = _with_head(2).init(jax.random.key(5), (2, 4))
    with pytest.raises(
        KeyError, match=r"missing keys: \['4.weight', '4.bias'\]; unexpected keys: \[\]"
    ):
        load_into(path, template)
    renamed = {"enc": _mlp().init(jax.random.key(0), (2, 4))}
    with pytest.raises(KeyError) as info:
        load_into(path, renamed)
    message = str(info.value)
    for name in ("enc.0.weight", "enc.2.bias", "'0.weight'", "'2.bias'"):
        assert name in message
    assert os.fspath(path) in message


def test_shape_mismatches_are_named_together(tmp_path):
    params = {"a": jnp.ones((2, 3)), "b": jnp.ones(4), "c": jnp.ones(1)}
    path = save(tmp_path / "p.safetensors", params)
    template = {"a": jnp.ones((3, 2)), "b": jnp.ones(5), "c": jnp.ones(1)}
    with pytest.raises(
        ValueError,
        match=r"shape mismatch for a: expected \(3, 2\), got \(2, 3\); b: expected \(5,\), got \(4,\)",
    ):
        load_into(path, template)
    with pytest.raises(ValueError, match=r"shape mismatch for a"):
        load_into(path, template, strict=False)


def test_non_strict_loads_a_backbone_under_a_new_head_and_reports_the_rest(mlp_file):
    path, params = mlp_file
    template = _with_head(2).init(jax.random.key(5), (2, 4))
    with pytest.warns(
        CheckpointWarning, match=r"2 names of the model were not in the checkpoint"
    ) as rec:
        loaded = load_into(path, template, strict=False)
    assert "['4.weight', '4.bias']" in str(rec[0].message)
    assert rec[0].filename == __file__
    np.testing.assert_array_equal(loaded["0"]["weight"], params["0"]["weight"])
    np.testing.assert_array_equal(loaded["4"]["weight"], template["4"]["weight"])

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded2, keys = load_into(path, template, strict=False, return_keys=True)
    assert keys == IncompatibleKeys(["4.weight", "4.bias"], [])
    np.testing.assert_array_equal(loaded2["4"]["bias"], template["4"]["bias"])

    small = {"0": _mlp().init(jax.random.key(0), (2, 4))["0"]}
    _, keys3 = load_into(path, small, strict=False, return_keys=True)
    assert keys3 == IncompatibleKeys([], ["2.weight", "2.bias"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_into(path, _mlp().init(jax.random.key(0), (2, 4)), strict=False)  # nothing to say


def test_non_strict_into_an_abstract_template_names_what_it_cannot_keep(mlp_file):
    """``strict=False`` keeps the template's values for missing names; an abstract
    template (``pl.params.abstract``) has none, so those names are a ``KeyError`` up
    front, as ``sharding.load_sharded`` says it, with ``Repeat`` blocks by index (before:
    ``ShapeDtypeStruct`` placeholders came back, failing later at ``apply``/``save``,
    or a bare ``TypeError`` halfway through a ``Repeat``)."""
    path, params = mlp_file
    template = pl.params.abstract(_with_head(2), (2, 4))
    with pytest.raises(
        KeyError, match=r"missing keys with no template value to keep: \['4\.bias', '4\.weight'\]"
    ):
        load_into(path, template, strict=False)
    with pytest.raises(KeyError, match=r"load_state_dict: missing keys with no template value"):
        load_state_dict(template, pl.params.flatten(params), strict=False)
    stack = L.Repeat(L.Linear(4), 3)
    full = stack.init(jax.random.key(0), (2, 4))
    flat = {k: v for k, v in pl.params.flatten(full).items() if not k.startswith("2.")}
    with pytest.raises(KeyError, match=r"no template value to keep: \['2\.bias', '2\.weight'\]"):
        load_state_dict(pl.params.abstract(stack, (2, 4)), flat, strict=False)
    kept = load_state_dict(full, flat, strict=False, return_keys=True)[0]  # concrete: kept
    np.testing.assert_array_equal(kept["weight"], full["weight"])


def test_load_state_dict_reports_unmatched_names_the_same_way():
    template = {"a": jnp.zeros(2), "b": jnp.zeros(2)}
    with pytest.warns(CheckpointWarning, match=r"load_state_dict\(strict=False\): 1 names"):
        out = load_state_dict(template, {"a": np.ones(2), "z": np.ones(1)}, strict=False)
    np.testing.assert_array_equal(out["a"], np.ones(2))
    out, keys = load_state_dict(template, {"a": np.ones(2)}, strict=False, return_keys=True)
    assert keys.missing_keys == ["b"] and keys.unexpected_keys == []


def test_loading_casts_to_the_template_dtypes(tmp_path):
    values = {
        "w": np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3),
        "d": np.arange(3, dtype=np.float64) / 3,
        "n": np.asarray(12, np.int64),
    }
    path = tmp_path / "c.safetensors"
    _io.write_file(
        path,
        [_io.Entry(k, v.dtype, v.shape, lambda v=v: v) for k, v in values.items()],
        None,
    )
    template = {
        "w": jnp.zeros((2, 3), jnp.bfloat16),
        "d": jnp.zeros(3, jnp.float32),
        "n": jnp.zeros((), jnp.int32),
    }
    out = load_into(path, template)
    assert {k: v.dtype for k, v in out.items()} == {
        "w": jnp.bfloat16,
        "d": jnp.float32,
        "n": jnp.int32,
    }
    np.testing.assert_array_equal(out["w"], values["w"].astype(jnp.bfloat16))
    np.testing.assert_allclose(out["d"], values["d"], rtol=1e-7)
    assert int(out["n"]) == 12


def test_an_abstract_template_loads_without_initializing_weights(mlp_file):
    path, params = mlp_file
    model = _mlp()
    abstract = jax.eval_shape(lambda k: model.init(k, (2, 4)), jax.random.key(0))
    loaded = load_into(path, abstract)
    for name, value in flatten(params).items():
        assert isinstance(flatten(loaded)[name], jax.Array)
        np.testing.assert_array_equal(flatten(loaded)[name], value)


# -- sharded checkpoints ----------------------------------------------------------------


def _wide():
    return L.Sequential(L.Linear(16), L.ReLU(), L.Linear(16), L.ReLU(), L.Linear(4))


def test_sharded_round_trip_in_hugging_face_layout(torch, tmp_path):
    params = _wide().init(jax.random.key(0), (2, 8))
    index_path = save(tmp_path / "ckpt", params, max_shard_bytes=600, metadata={"step": "9"})
    assert index_path == tmp_path / "ckpt" / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    flat = flatten(params)
    assert set(index) == {"metadata", "weight_map"}
    assert list(index["weight_map"]) == list(flat)
    assert index["metadata"]["total_size"] == sum(a.nbytes for a in flat.values())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) >= 3
    assert shards == [
        f"model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, len(shards) + 1)
    ]
    merged = {}
    for shard in shards:
        part = st.load_file(tmp_path / "ckpt" / shard)
        assert sum(t.numel() * t.element_size() for t in part.values()) <= 600 or len(part) == 1
        assert all(index["weight_map"][k] == shard for k in part)
        merged.update(part)
    module = torch.nn.Sequential(
        torch.nn.Linear(8, 16),
        torch.nn.ReLU(),
        torch.nn.Linear(16, 16),
        torch.nn.ReLU(),
        torch.nn.Linear(16, 4),
    )
    module.load_state_dict(merged, strict=True)
    for source in (tmp_path / "ckpt", index_path):
        loaded = load(source)
        assert list(loaded) == list(flat)
        for k, v in flat.items():
            np.testing.assert_array_equal(loaded[k], v)
    template = _wide().init(jax.random.key(1), (2, 8))
    again = load_into(tmp_path / "ckpt", template)
    np.testing.assert_array_equal(again["4"]["weight"], params["4"]["weight"])
    assert load_metadata(tmp_path / "ckpt") == {"format": "pt", "step": "9"}

    save(tmp_path / "ckpt", params, max_shard_bytes=10**6)  # fewer shards: stale ones go
    assert sorted(os.listdir(tmp_path / "ckpt")) == [
        "model-00001-of-00001.safetensors",
        "model.safetensors.index.json",
    ]
    np.testing.assert_array_equal(load(tmp_path / "ckpt")["2.bias"], params["2"]["bias"])


def test_sharded_errors_name_the_index_and_the_shard(tmp_path):
    params = _wide().init(jax.random.key(0), (2, 8))
    index_path = save(tmp_path, params, max_shard_bytes=600)
    good = index_path.read_text()
    index_path.write_text(good[:-20])
    with pytest.raises(
        CheckpointError,
        match=_error_names(index_path) + r": not a valid sharded-checkpoint index: not JSON",
    ):
        load(tmp_path)
    index_path.write_text(json.dumps({"metadata": {}}))
    with pytest.raises(CheckpointError, match=r"expected \{\"metadata\""):
        load(index_path)
    index = json.loads(good)
    index["weight_map"]["0.weight"] = "../elsewhere.safetensors"
    index_path.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"not a file in its folder"):
        load(tmp_path)
    index_path.write_text(good)
    last = sorted(set(json.loads(good)["weight_map"].values()))[-1]
    (tmp_path / last).rename(tmp_path / "moved.safetensors")
    with pytest.raises(CheckpointError, match=r"shard .*" + re.escape(last) + r" is missing"):
        load(tmp_path)
    (tmp_path / "moved.safetensors").rename(tmp_path / last)
    index = json.loads(good)
    index["weight_map"]["4.bias"] = index["weight_map"]["0.weight"]
    index_path.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"does not match the index .*\['4.bias'\]"):
        load(tmp_path)


def test_folders_and_missing_paths(tmp_path, mlp_file):
    _, params = mlp_file
    assert list(load(tmp_path)) == list(flatten(params))  # the only .safetensors file
    with pytest.raises(FileNotFoundError, match=r"no checkpoint at .*nothing.safetensors"):
        load(tmp_path / "nothing.safetensors")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointError, match=r"empty: the folder holds no single checkpoint"):
        load(empty)


# -- renaming ---------------------------------------------------------------------------


def test_rename_with_rules_and_functions():
    flat = {"module.enc.0.weight": 1, "module.enc.0.bias": 2, "module.head.weight": 3}
    assert rename(flat, {"module": ""}) == {"enc.0.weight": 1, "enc.0.bias": 2, "head.weight": 3}
    assert list(rename(flat, {"module.enc": "backbone", "module": "m"})) == [
        "backbone.0.weight",
        "backbone.0.bias",
        "m.head.weight",
    ]
    assert rename(flat, {"head": None}) == {"module.enc.0.weight": 1, "module.enc.0.bias": 2}
    assert rename(flat, lambda n: None if n.endswith("bias") else n.upper()) == {
        "MODULE.ENC.0.WEIGHT": 1,
        "MODULE.HEAD.WEIGHT": 3,
    }
    assert rename({"encoder_x.weight": 1}, {"encoder": "e"}) == {"encoder_x.weight": 1}
    with pytest.raises(
        ValueError, match=r"several names map to one name: \['a.w', 'b.w'\] -> 'c.w'"
    ):
        rename({"a.w": 1, "b.w": 2}, {"a": "c", "b": "c"})
    with pytest.raises(ValueError, match=r"'a.w' maps to '', which is not a dotted name"):
        rename({"a.w": 1}, lambda n: "")
    with pytest.raises(ValueError, match=r"rule '.x' is not a dotted name"):
        rename({"a.w": 1}, {".x": "y"})


def test_mha_maps_are_inverse_of_each_other(torch):
    module = torch.nn.ModuleDict({"attn": torch.nn.MultiheadAttention(8, 2)})
    sd = module.state_dict()
    ours = rename(sd, TORCH_MHA_TO_PURELAYERS)
    assert list(ours) == ["attn.qkv.weight", "attn.qkv.bias", "attn.out.weight", "attn.out.bias"]
    assert list(rename(ours, PURELAYERS_TO_TORCH_MHA)) == list(sd)


def test_torch_multihead_attention_checkpoints_cross_through_the_name_map(torch, tmp_path):
    layer = L.MultiHeadAttention(2)
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    module = torch.nn.ModuleDict({"attn": mha}).eval()
    x = _x(2, 5, 8)

    def call(m, x):
        return m["attn"](x, x, x, need_weights=False)[0]

    def ours(p, x):
        return layer.apply(p["attn"], x)

    st.save_file(module.state_dict(), tmp_path / "torch.safetensors")
    template = {"attn": layer.init(jax.random.key(0), x.shape)}
    params = load_state_dict(
        template, rename(load(tmp_path / "torch.safetensors"), TORCH_MHA_TO_PURELAYERS)
    )
    assert list(flatten(params)) == [
        "attn.qkv.weight",
        "attn.qkv.bias",
        "attn.out.weight",
        "attn.out.bias",
    ]

    @jax.jit
    def under_torch_names(p, x):  # gradients are compared name by name with torch's
        return ours(unflatten(rename(flatten(p), TORCH_MHA_TO_PURELAYERS)), x)

    torch_named = unflatten(rename(flatten(params), PURELAYERS_TO_TORCH_MHA))
    pl.testing.assert_matches_torch(
        layer, module, x, params=torch_named, apply=under_torch_names, torch_call=call
    )

    mine = {"attn": layer.init(jax.random.key(3), x.shape)}
    path = save(
        tmp_path / "ours.safetensors", unflatten(rename(flatten(mine), PURELAYERS_TO_TORCH_MHA))
    )
    module.load_state_dict(st.load_file(path), strict=True)
    with torch.no_grad():
        expected = call(module, torch.tensor(x)).numpy()
    np.testing.assert_allclose(np.asarray(ours(mine, jnp.asarray(x))), expected, atol=1e-5)


# -- summary ----------------------------------------------------------------------------


def test_summary_lists_a_key_sorted_tree_in_torch_order():
    model = L.Sequential(*[L.Linear(3) for _ in range(11)])
    params = model.init(jax.random.key(0), (1, 2))
    sorted_params = jax.jit(lambda p: p)(params)
    assert list(flatten(sorted_params))[:3] == ["0.bias", "0.weight", "1.bias"]
    table = summary(model, sorted_params).splitlines()
    names = [line.split()[0] for line in table[2:-2]]
    assert names == list(flatten(params))
    assert names[:3] == ["0.weight", "0.bias", "1.weight"] and names[-1] == "10.bias"
    assert table[0].split() == ["name", "shape", "dtype", "count", "kind"]
    assert table[2].split() == ["0.weight", "(3,", "2)", "float32", "6", "trainable"]
    # 2 -> 3: 6 + 3; then ten 3 -> 3: 9 + 3 each; 129 float32 values are 516 bytes
    assert table[-1] == "total: 129 trainable parameters in 22 arrays (516 B)"
    assert pl.params.count(params) == 129


# -- every family both ways -------------------------------------------------------------


def _leaves(out):
    return jax.tree.leaves(out)


def _torch_leaves(out):
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _torch_leaves(o)]
    return [out]


def _round_trip(torch, tmp_path, layer, make_module, shape, x, *, apply=None, call=None, tol=1e-5):
    """Both directions for one family.

    Ours to torch: ``save`` then ``module.load_state_dict(load_file(path), strict=True)``
    with every dtype as torch's own, and equal outputs. Torch to ours: a differently
    initialized module's ``save_file`` then ``load_into`` gives equal outputs and
    gradients (``pl.testing.assert_matches_torch``). ``apply(params, state, x)`` runs our
    model in eval mode.
    """
    apply = jax.jit(
        apply or (lambda p, s, x: layer.apply(p, x, state=s)[0] if s else layer.apply(p, x))
    )
    call = call or (lambda m, x: m(x))
    params = layer.init(jax.random.key(0), shape)
    state = layer.init_state(shape) or None
    if state is not None:  # trained-looking running statistics and step counters
        state = jax.tree.map(
            lambda a: a + 3 if jnp.issubdtype(a.dtype, jnp.integer) else a * 0.5 + 0.25, state
        )
    path = save(tmp_path / "ours.safetensors", params, state, model=layer)
    module = make_module(0).eval()
    reference = module.state_dict()
    from_file = st.load_file(path)
    assert {k: v.dtype for k, v in from_file.items()} == {k: v.dtype for k, v in reference.items()}
    assert list(load(path)) == list(reference)
    module.load_state_dict(from_file, strict=True)
    with torch.no_grad():
        expected = _torch_leaves(call(module, torch.tensor(x)))
    got = _leaves(apply(params, state, jnp.asarray(x)))
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(np.asarray(g), e.numpy(), rtol=tol, atol=tol)

    other = make_module(1).eval()
    st.save_file(other.state_dict(), tmp_path / "torch.safetensors")
    loaded = load_into(tmp_path / "torch.safetensors", params, state)
    p2, s2 = loaded if state is not None else (loaded, None)
    assert not np.array_equal(
        flatten(p2)[next(iter(flatten(p2)))], next(iter(flatten(params).values()))
    )
    pl.testing.assert_matches_torch(
        layer,
        other,
        x,
        params=p2,
        apply=lambda p, x: apply(p, s2, x),
        torch_call=call,
        rtol=tol,
        atol=tol,
    )
    return p2, s2


def _seeded(torch, build):
    def make(seed):
        torch.manual_seed(seed)
        return build()

    return make


_RECURRENT = {
    "lstm-2-layer-bidirectional": (
        lambda: L.LSTM(5, num_layers=2, bidirectional=True, batch_first=True),
        lambda nn: nn.LSTM(4, 5, num_layers=2, bidirectional=True, batch_first=True),
    ),
    "gru": (lambda: L.GRU(6, batch_first=True), lambda nn: nn.GRU(4, 6, batch_first=True)),
}


@pytest.mark.parametrize("kind", list(_RECURRENT))
def test_recurrent_layers_both_ways(torch, tmp_path, kind):
    ours, theirs = _RECURRENT[kind]
    layer = ours()
    make = _seeded(torch, lambda: theirs(torch.nn))
    x = _x(2, 3, 4)
    _round_trip(torch, tmp_path, layer, make, x.shape, x, apply=lambda p, s, x: layer.apply(p, x))


def test_cnn_with_batch_norm_state_and_pooling_both_ways(torch, tmp_path):
    conv = pytest.importorskip("purelayers.layers.conv")
    pool = pytest.importorskip("purelayers.layers.pool")
    layer = L.Sequential(
        conv.Conv2d(4, 3, padding=1),
        L.BatchNorm2d(),
        L.ReLU(),
        pool.MaxPool2d(2),
        L.Flatten(),
        L.Linear(5),
    )
    nn = torch.nn

    def build():
        module = nn.Sequential(
            nn.Conv2d(2, 4, 3, padding=1),
            nn.BatchNorm2d(4),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(4 * 3 * 3, 5),
        )
        with torch.no_grad():  # running statistics away from their initial values
            for _ in range(3):
                module(torch.randn(4, 2, 6, 6) * 2 + 1)
        return module

    x = _x(2, 2, 6, 6)
    _, state = _round_trip(torch, tmp_path, layer, _seeded(torch, build), x.shape, x)
    assert state["1"]["num_batches_tracked"].dtype == jnp.int32
    assert int(state["1"]["num_batches_tracked"]) == 3
    ours = load(tmp_path / "ours.safetensors")
    assert ours["1.num_batches_tracked"].dtype == jnp.int32  # int64 in the file, JAX's default
    assert st.load_file(tmp_path / "ours.safetensors")["1.num_batches_tracked"].item() == 3


def _torch_gpt(torch, vocab, width, heads, blocks):
    """A torch GPT written with purelayers' names (``attn.qkv``/``attn.out`` Linear maps,
    as nanoGPT packs them), so our checkpoint loads into it without any renaming."""
    nn, F = torch.nn, torch.nn.functional

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(width, 3 * width)
            self.out = nn.Linear(width, width)

        def forward(self, x):
            b, t, e = x.shape
            q, k, v = (
                z.view(b, t, heads, e // heads).transpose(1, 2)
                for z in self.qkv(x).split(e, dim=-1)
            )
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.out(y.transpose(1, 2).reshape(b, t, e))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(width)
            self.attn = Attention()
            self.ln2 = nn.LayerNorm(width)
            self.fc = nn.Linear(width, 4 * width)
            self.proj = nn.Linear(4 * width, width)

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.proj(F.gelu(self.fc(self.ln2(x))))

    return nn.Sequential(
        nn.Embedding(vocab, width),
        *[Block() for _ in range(blocks)],
        nn.LayerNorm(width),
        nn.Linear(width, vocab),
    )


def test_embedding_and_transformer_block_stack_both_ways(torch, tmp_path):
    transformer = pytest.importorskip("purelayers.layers.transformer")
    embedding = pytest.importorskip("purelayers.layers.embedding")
    vocab, width, heads = 11, 8, 2
    layer = L.Sequential(
        embedding.Embedding(vocab, width),
        transformer.TransformerBlock(heads),
        transformer.TransformerBlock(heads),
        L.LayerNorm(),
        L.Linear(vocab),
    )
    make = _seeded(torch, lambda: _torch_gpt(torch, vocab, width, heads, 2))
    ids = np.random.default_rng(0).integers(0, vocab, (2, 5))
    params, _ = _round_trip(torch, tmp_path, layer, make, ids.shape, ids, tol=2e-5)
    assert list(flatten(params))[:8] == [
        "0.weight",
        "1.ln1.weight",
        "1.ln1.bias",
        "1.attn.qkv.weight",
        "1.attn.qkv.bias",
        "1.attn.out.weight",
        "1.attn.out.bias",
        "1.ln2.weight",
    ]


def test_summary_marks_buffers_and_orders_them_as_torch_does(torch):
    model = L.Sequential(L.Linear(4), L.BatchNorm1d(), L.Linear(2))
    params = jax.jit(lambda p: p)(model.init(jax.random.key(0), (3, 5)))
    state = jax.jit(lambda s: s)(model.init_state((3, 5)))
    table = summary(model, params, state).splitlines()
    rows = [line.split() for line in table[2:-2]]
    reference = torch.nn.Sequential(
        torch.nn.Linear(5, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2)
    )
    assert [r[0] for r in rows] == list(reference.state_dict())
    kinds = {r[0]: r[-1] for r in rows}
    assert kinds["1.weight"] == "trainable"
    assert kinds["1.running_var"] == kinds["1.num_batches_tracked"] == "buffer"
    # 20 + 4 + 4 + 4 + 8 + 2 trainable; 4 + 4 + 1 buffer values; 4 bytes each
    assert table[-1] == "total: 42 trainable parameters, 9 buffer values in 9 arrays (204 B)"
