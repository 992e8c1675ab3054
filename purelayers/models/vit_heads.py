"""ViT's image-classification head, as transformers' ``ViTForImageClassification``:
a ``vit`` (``ViTModel`` without its pooler) and a ``classifier`` on the CLS token's
final-layernormed state, under the names transformers writes::

    vit.*                          ViTModel's checkpoint names, prefixed, no pooler
    classifier.weight, .bias       (num_labels, hidden_size)
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from purelayers.layers import Layer, Params
from purelayers.layers._checks import as_shape
from purelayers.models._parts import fold, init_children
from purelayers.models.bert import Built, _dense, _std
from purelayers.models.vit import ViTConfig, ViTModel

__all__ = ["ViTForImageClassification"]


@dataclasses.dataclass(frozen=True)
class ViTForImageClassification(Built):
    r"""``transformers.ViTForImageClassification``: ``logits =
    classifier(last_hidden_state[:, 0])``, ``last_hidden_state`` the output of ``vit``
    (a ``ViTModel(config, add_pooling_layer=False)``, its final ``layernorm`` included),
    ``config.num_labels`` wide.

    ``apply(params, pixel_values, *, key=None, train=False)`` returns the logits, as
    transformers' ``.logits`` (no loss). Dropout runs only with ``train=True``.

    Args:
      config: a ``ViTConfig``; ``id2label`` sets the labels.

    Shape:
      ``pixel_values`` ``(batch, num_channels, H, W)`` (``config.image_size``); output
      ``(batch, num_labels)``.

    Parameters:
      ``vit.*`` (``ViTModel``'s, no pooler); ``classifier.weight`` ``(num_labels,
      hidden_size)`` ``N(0, initializer_range^2)``, ``classifier.bias`` zeros.

    Example:
      >>> from purelayers.models import ViTConfig, ViTForImageClassification
      >>> model = ViTForImageClassification(ViTConfig(
      ...     hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16,
      ...     image_size=8, patch_size=4, id2label={0: "cat", 1: "dog", 2: "bird"}))
      >>> params = model.init(jax.random.key(0), model.example_shape())
      >>> model.apply(params, jnp.zeros((2, 3, 8, 8))).shape
      (2, 3)
    """

    config: ViTConfig

    config_class: ClassVar[type[ViTConfig]] = ViTConfig
    base_model_prefix: ClassVar[str] = "vit"
    ignore_on_load: ClassVar[tuple[str, ...]] = ()
    optional_on_load: ClassVar[tuple[str, ...]] = ()
    peft_task_type: ClassVar[str] = "SEQ_CLS"

    def __post_init__(self):
        if not isinstance(self.config, ViTConfig):
            raise ValueError(
                f"ViTForImageClassification: config must be a ViTConfig, got {self.config!r}"
            )
        super().__post_init__()

    def example_shape(self) -> tuple[int, ...]:
        """The input shape ``from_pretrained`` builds its params template for."""
        return (1, self.config.num_channels, *self.config.image)

    def build(self) -> dict[str, Layer]:
        c = self.config
        return {
            "vit": ViTModel(c, add_pooling_layer=False),
            "classifier": _dense(c.num_labels, _std(c.initializer_range)),
        }

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        pixels = as_shape(shape)
        shapes = {"vit": pixels, "classifier": (pixels[0], self.config.hidden_size)}
        return init_children(self, key, shapes, dtype)

    def apply(
        self,
        params: Params,
        pixel_values: Any,
        *,
        key: jax.Array | None = None,
        train: bool = False,
    ) -> jax.Array:
        h = self.call("vit", params, pixel_values, key=fold(key, 0), train=train)
        return self.call("classifier", params, h[:, 0])
