"""CLIP's and SigLIP's configs share these: the checks of a tower's settings and
``text_config``/``vision_config`` held as dicts and read as dataclasses."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, ClassVar

from purelayers.layers._checks import check_choice, check_float, check_int
from purelayers.models.bert import _ACTIVATIONS
from purelayers.models.config import Config, _thawed

__all__ = ["CLIPConfig", "CLIPTextConfig", "CLIPVisionConfig"]


def check_tower(config: Config) -> None:
    """The checks every tower config shares: sizes, activation, eps, dropout."""
    name = type(config).__name__
    for field in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
        check_int(name, field, getattr(config, field))
    if config.hidden_size % config.num_attention_heads:
        raise ValueError(
            f"{name}: hidden_size must be divisible by num_attention_heads="
            f"{config.num_attention_heads}, got {config.hidden_size}"
        )
    check_choice(name, "hidden_act", config.hidden_act, ("quick_gelu", *_ACTIVATIONS))
    check_float(name, "layer_norm_eps", config.layer_norm_eps, low=0.0, low_open=True)
    check_float(name, "attention_dropout", config.attention_dropout, low=0.0, high=1.0)


def check_vision(config: Config) -> None:
    """A vision tower's image and patch sizes: positive ints, the patch fitting."""
    name = type(config).__name__
    for field in ("image_size", "patch_size", "num_channels"):
        check_int(name, field, getattr(config, field))
    if config.patch_size > config.image_size:
        raise ValueError(
            f"{name}: patch_size must be at most image_size={config.image_size}, "
            f"got {config.patch_size}"
        )


@dataclasses.dataclass(frozen=True)
class CLIPTextConfig(Config):
    """``transformers.CLIPTextConfig``: the same field names and defaults.
    ``eos_token_id`` picks the pooled token: ``2`` keeps the old rule (the position of
    the largest id), any other id the first position holding it."""

    model_type: ClassVar[str] = "clip_text_model"

    vocab_size: int = 49408
    hidden_size: int = 512
    intermediate_size: int = 2048
    projection_dim: int = 512
    num_hidden_layers: int = 12
    num_attention_heads: int = 8
    max_position_embeddings: int = 77
    hidden_act: str = "quick_gelu"
    layer_norm_eps: float = 1e-5
    attention_dropout: float = 0.0
    initializer_range: float = 0.02
    initializer_factor: float = 1.0
    pad_token_id: int | None = 1
    bos_token_id: int | None = 49406
    eos_token_id: int = 49407

    def __post_init__(self):
        super().__post_init__()
        check_tower(self)
        for field in ("vocab_size", "max_position_embeddings"):
            check_int("CLIPTextConfig", field, getattr(self, field))
        check_int("CLIPTextConfig", "eos_token_id", self.eos_token_id, minimum=0)


@dataclasses.dataclass(frozen=True)
class CLIPVisionConfig(Config):
    """``transformers.CLIPVisionConfig``: the same field names and defaults (square
    images: ``image_size`` and ``patch_size`` are ints)."""

    model_type: ClassVar[str] = "clip_vision_model"

    hidden_size: int = 768
    intermediate_size: int = 3072
    projection_dim: int = 512
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    num_channels: int = 3
    image_size: int = 224
    patch_size: int = 32
    hidden_act: str = "quick_gelu"
    layer_norm_eps: float = 1e-5
    attention_dropout: float = 0.0
    initializer_range: float = 0.02
    initializer_factor: float = 1.0

    def __post_init__(self):
        super().__post_init__()
        check_tower(self)
        check_vision(self)


class _TwoTowers:
    """A config holding ``text_config`` and ``vision_config`` dicts (transformers'
    sub-configs), read as the dataclasses ``text_class`` and ``vision_class``."""

    text_class: ClassVar[type[Config]]
    vision_class: ClassVar[type[Config]]

    @functools.cached_property
    def text(self) -> Any:
        """``text_config`` as its config class (defaults for absent entries)."""
        return self.text_class.from_dict(self.text_config or {})

    @functools.cached_property
    def vision(self) -> Any:
        """``vision_config`` as its config class (defaults for absent entries)."""
        return self.vision_class.from_dict(self.vision_config or {})

    def check_towers(self) -> None:
        for field in ("text_config", "vision_config"):
            value = getattr(self, field)
            if value is not None and not hasattr(value, "keys"):
                raise ValueError(
                    f"{type(self).__name__}: {field} must be a dict or None, got {value!r}"
                )
            try:
                getattr(self, field.split("_")[0])
            except ValueError as e:
                raise ValueError(f"{type(self).__name__}: {field}: {e}") from None

    def to_dict(self) -> dict[str, Any]:
        """The ``config.json`` dict; each sub-config written whole (its entries as given,
        every field this library reads filled in)."""
        out = super().to_dict()  # type: ignore[misc]
        out["text_config"] = {**_thawed(self.text_config or {}), **self.text.to_dict()}
        out["vision_config"] = {**_thawed(self.vision_config or {}), **self.vision.to_dict()}
        return out


@dataclasses.dataclass(frozen=True)
class CLIPConfig(_TwoTowers, Config):
    """``transformers.CLIPConfig``: ``text_config`` and ``vision_config`` are dicts as in
    ``config.json`` (``None``: the defaults), read as ``config.text``
    (``CLIPTextConfig``) and ``config.vision`` (``CLIPVisionConfig``);
    ``projection_dim`` is the width of both projections, ``logit_scale_init_value`` the
    initial ``logit_scale``."""

    model_type: ClassVar[str] = "clip"
    text_class: ClassVar[type[Config]] = CLIPTextConfig
    vision_class: ClassVar[type[Config]] = CLIPVisionConfig

    text_config: Any = None
    vision_config: Any = None
    projection_dim: int = 512
    logit_scale_init_value: float = 2.6592
    initializer_factor: float = 1.0

    def __post_init__(self):
        super().__post_init__()
        self.check_towers()
        check_int("CLIPConfig", "projection_dim", self.projection_dim)
        check_float("CLIPConfig", "logit_scale_init_value", self.logit_scale_init_value)
