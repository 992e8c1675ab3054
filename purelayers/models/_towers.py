"""What CLIP's and SigLIP's towers share outside their layers: the input checks, the
padding mask, the patch tokens and the normalization of the embeddings."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from purelayers.layers import Layer, LayerError, Params
from purelayers.layers._checks import as_array

__all__ = ["check_ids", "check_pixels", "normalized", "padding_mask", "patches"]


def check_ids(model: str, config: Any, input_ids: Any, attention_mask: Any) -> jax.Array:
    """``input_ids`` as an array, ``(batch, seq)`` with ``seq`` at most
    ``max_position_embeddings``, and ``attention_mask`` of its shape."""
    ids = as_array(input_ids)
    if ids.ndim != 2:
        raise LayerError(model, "input_ids shape", "(batch, seq)", ids.shape)
    if ids.shape[1] > config.max_position_embeddings:
        raise LayerError(
            model,
            "input_ids axis 1 (sequence length)",
            f"at most max_position_embeddings={config.max_position_embeddings}",
            ids.shape[1],
        )
    if attention_mask is not None and jnp.shape(attention_mask) != ids.shape:
        raise LayerError(model, "attention_mask shape", ids.shape, jnp.shape(attention_mask))
    return ids


def check_pixels(model: str, config: Any, pixel_values: Any) -> jax.Array:
    """``pixel_values`` as an array of shape ``(batch, num_channels, image_size,
    image_size)``; a ``LayerError`` naming the first axis that differs otherwise."""
    x = jnp.asarray(pixel_values)
    c, s = config.num_channels, config.image_size
    if x.ndim != 4:
        raise LayerError(model, "pixel_values shape", f"(batch, {c}, {s}, {s})", x.shape)
    for axis, what, want in ((1, "channels", c), (2, "height", s), (3, "width", s)):
        if x.shape[axis] != want:
            raise LayerError(
                model,
                f"pixel_values axis {axis} ({what})",
                want,
                x.shape[axis],
                f"pixel_values.shape == {x.shape}; the channels and image size are the vision "
                "config's num_channels and image_size (position embeddings are not "
                "interpolated): resize the images",
            )
    return x


def padding_mask(attention_mask: Any) -> Any:
    """``(batch, seq)`` ones and zeros as a key mask ``(batch, 1, 1, seq)``."""
    if attention_mask is None:
        return None
    return (jnp.asarray(attention_mask) != 0)[:, None, None, :]


def patches(layer: Layer, params: Params, pixel_values: Any) -> jax.Array:
    """``layer``'s ``patch_embedding`` (a strided ``Conv2d``) on ``pixel_values``, cast
    to its weight's dtype as transformers casts them, flattened to tokens.

    Shape:
      ``pixel_values`` ``(batch, C, H, W)``; output ``(batch, num_patches, E)``.
    """
    weight = params.get("patch_embedding", {}).get("weight")
    if weight is not None:
        pixel_values = jnp.asarray(pixel_values).astype(weight.dtype)
    x = layer.call("patch_embedding", params, pixel_values)  # (batch, E, h, w)
    b, e = x.shape[:2]
    return jnp.swapaxes(x.reshape(b, e, math.prod(x.shape[2:])), 1, 2)


def normalized(x: jax.Array) -> jax.Array:
    """``x / ||x||`` along the last axis, as transformers writes it."""
    return x / jnp.sqrt(jnp.sum(x * x, axis=-1, keepdims=True))
