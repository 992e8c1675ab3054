"""What every implementation hands the benchmark, and the training steps that run it.

A JAX implementation (purelayers, raw JAX, Flax, Equinox, Haiku) is reduced to a
``JaxModel``: a pytree of float32 parameters, a pure ``forward(params, x)`` and its
input in the library's own layout. Every JAX library then trains through the same
jitted optax step (``JaxRunner``), so the timings compare the computation each library
emits, not its jit wrapper. PyTorch gets the equivalent loop, eager or under
``torch.compile`` (``TorchRunner``).
"""

from __future__ import annotations

import dataclasses
import resource
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.workloads import loss_from_logits

__all__ = ["CpuUse", "JaxModel", "JaxRunner", "TorchModel", "TorchRunner", "median_spread"]

LEARNING_RATE = 1e-3


@dataclasses.dataclass
class JaxModel:
    """``forward(params, x) -> logits``; ``x`` already in the library's layout."""

    params: Any
    forward: Callable[[Any, Any], jax.Array]
    x: Any
    y: Any


@dataclasses.dataclass
class TorchModel:
    module: Any
    x: Any
    y: Any


def _rss_mb() -> float:
    """This process's resident-set high-water mark in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def batch_axis(leaf: Any, batch: int) -> int:
    """The one axis of an input array whose length is the batch size ``batch``."""
    axes = [i for i, n in enumerate(np.shape(leaf)) if n == batch]
    if len(axes) != 1:
        raise ValueError(
            f"cannot tell the batch axis of an input of shape {np.shape(leaf)}: "
            f"{len(axes)} axes have the batch size {batch}"
        )
    return axes[0]


def data_parallel(tree: Any, y: Any, devices: int) -> tuple[Any, Any, Any]:
    """``tree`` (the inputs) split along each array's batch axis and ``y`` along its first
    over the first ``devices`` JAX devices, and the replicated sharding for the rest."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    if devices > len(jax.devices()):
        raise ValueError(f"{devices} devices asked for, {len(jax.devices())} available")
    mesh = Mesh(np.array(jax.devices()[:devices]), ("data",))
    batch = int(np.shape(y)[0])
    if batch % devices:
        raise ValueError(f"a batch of {batch} does not split over {devices} devices")

    def split(leaf):
        spec = [None] * np.ndim(leaf)
        spec[batch_axis(leaf, batch)] = "data"
        return jax.device_put(leaf, NamedSharding(mesh, PartitionSpec(*spec)))

    replicated = NamedSharding(mesh, PartitionSpec())
    return jax.tree.map(split, tree), split(y), replicated


class JaxRunner:
    """One jitted Adam training step with donated params and optimizer state.

    The step is compiled ahead of time (``lower().compile()``) so its XLA memory
    analysis is available; calling the compiled step is what ``jax.jit`` does after its
    first call. With ``devices`` > 1 the batch is split over that many devices (params
    and optimizer state replicated; XLA all-reduces the gradients): on the CPU, host
    devices (``jax_num_cpu_devices``), each running its share of every kernel.
    """

    has_eager = True  # the model's forward can also be timed un-jitted

    def __init__(
        self, model: JaxModel, xla_options: dict[str, str] | None = None, devices: int = 1
    ):
        import optax

        self.model = model
        self.xla_options = dict(xla_options or {})
        opt = optax.adam(LEARNING_RATE)

        def loss(params, x, y):
            return loss_from_logits(model.forward(params, x), y)

        def step(params, opt_state, x, y):
            value, grads = jax.value_and_grad(loss)(params, x, y)
            updates, opt_state = opt.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, value

        self._jit_step = jax.jit(step, donate_argnums=(0, 1))
        self.params = jax.tree.map(jnp.asarray, model.params)
        self.x = jax.tree.map(jnp.asarray, model.x)
        self.y = jnp.asarray(model.y)
        if devices > 1:
            self.x, self.y, replicated = data_parallel(self.x, self.y, devices)
            self.params = jax.device_put(self.params, replicated)
        self.opt_state = opt.init(self.params)
        self.compiled = None
        self.timings: dict[str, float] = {}

    def param_count(self) -> int:
        return sum(int(np.prod(a.shape)) for a in jax.tree.leaves(self.params))

    def initial_loss(self) -> float:
        """The loss at the initial params: the value the first training step returns
        (this takes that step, and saves compiling a separate loss function)."""
        if self.compiled is None:
            self.compile()
        self.params, self.opt_state, loss = self.compiled(
            self.params, self.opt_state, self.x, self.y
        )
        return float(loss)

    def compile(self) -> None:
        """Trace + lower, then compile; times both into ``self.timings``."""
        t0 = time.perf_counter()
        lowered = self._jit_step.lower(self.params, self.opt_state, self.x, self.y)
        t1 = time.perf_counter()
        self.compiled = lowered.compile(self.xla_options or None)
        self.timings.update(trace_s=t1 - t0, compile_s=time.perf_counter() - t1)

    def memory_mb(self) -> dict[str, float]:
        """XLA's buffer assignment for the step: arguments (params, Adam state, batch) and
        temporaries (activations, gradients); outputs alias the donated arguments."""
        if self.compiled is None:
            self.compile()
        ma = self.compiled.memory_analysis()
        if ma is None:
            return {}
        mib = 1024 * 1024
        args, temp = ma.argument_size_in_bytes, ma.temp_size_in_bytes
        return {"args_mb": args / mib, "temp_mb": temp / mib, "peak_mb": (args + temp) / mib}

    def run(self, n: int) -> float:
        """Run ``n`` training steps; seconds per step."""
        if self.compiled is None:
            self.compile()
        t0 = time.perf_counter()
        for _ in range(n):
            self.params, self.opt_state, loss = self.compiled(
                self.params, self.opt_state, self.x, self.y
            )
        jax.block_until_ready((loss, self.params))
        return (time.perf_counter() - t0) / n

    def eager_forward(self) -> float:
        """One un-jitted forward pass (op-by-op dispatch); seconds."""
        t0 = time.perf_counter()
        jax.block_until_ready(self.model.forward(self.params, self.x))
        return time.perf_counter() - t0

    def first_call(self) -> dict[str, float]:
        """Trace + compile + first step, in this (fresh) process."""
        t0 = time.perf_counter()
        self.compile()
        self.run(1)
        out = dict(self.timings, first_call_s=time.perf_counter() - t0)
        out.update(self.memory_mb())
        out["devices"] = len(jax.tree.leaves(self.params)[0].sharding.device_set)
        return out


class TorchRunner:
    """The same training step in PyTorch: ``torch.optim.Adam`` with optax's defaults
    (betas 0.9/0.999, eps 1e-8), ``F.cross_entropy``.

    Eager by default; with ``compiled`` the module is ``torch.compile``'d (default
    mode: TorchDynamo and Inductor compile its forward and, through AOTAutograd, its
    backward; the optimizer step stays eager), as ``model = torch.compile(model)`` does
    in a training script. Its compilation happens on the first call: ``compile`` runs one
    forward and backward (no update, so the initial loss is still the shared one) and
    ``first_call`` in a fresh process includes it."""

    def __init__(self, model: TorchModel, compiled: bool = False):
        import torch

        self.torch = torch
        # the GPU where torch has one (as JAX picks its default device), else the CPU
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.eager = model.module.to(self.device)
        self.compiled = compiled
        self.module = torch.compile(self.eager) if compiled else self.eager
        self.x, self.y = model.x.to(self.device), model.y.to(self.device)
        self.opt = torch.optim.Adam(self.eager.parameters(), lr=LEARNING_RATE)
        self.timings: dict[str, float] = {}

    def _sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()

    def param_count(self) -> int:
        return sum(p.numel() for p in self.module.parameters())

    def _loss(self, module=None):
        logits = (self.module if module is None else module)(self.x)
        return self.torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), self.y.reshape(-1)
        )

    def initial_loss(self) -> float:
        # the eager module shares the compiled one's parameters; running it here spares
        # Inductor a separate no-grad graph
        with self.torch.no_grad():
            return float(self._loss(self.eager))

    def compile(self) -> None:
        """``torch.compile``: one forward and backward, timed, gradients dropped."""
        if not self.compiled or "compile_s" in self.timings:
            return
        t0 = time.perf_counter()
        self._loss().backward()
        self._sync()
        self.opt.zero_grad(set_to_none=True)
        self.timings["compile_s"] = time.perf_counter() - t0

    def memory_mb(self) -> dict[str, float]:
        return {}

    def run(self, n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            self.opt.zero_grad(set_to_none=True)
            loss = self._loss()
            loss.backward()
            self.opt.step()
        loss.item()
        return (time.perf_counter() - t0) / n

    @property
    def has_eager(self) -> bool:
        """Whether an un-jitted forward is this runner's to time (not a compiled one's)."""
        return not self.compiled

    def eager_forward(self) -> float:
        t0 = time.perf_counter()
        with self.torch.no_grad():
            self.eager(self.x)
        self._sync()
        return time.perf_counter() - t0

    def first_call(self) -> dict[str, float]:
        """First step, and the step's peak memory: the bytes already resident (params,
        batch) plus the growth of the RSS high-water mark over three steps (gradients,
        Adam state, activations, allocator caches)."""
        resident = sum(p.numel() * p.element_size() for p in self.module.parameters())
        resident += sum(t.numel() * t.element_size() for t in (self.x, self.y))
        base = _rss_mb()
        t0 = time.perf_counter()
        self.compile()
        self.run(1)
        first = time.perf_counter() - t0
        self.run(2)
        if self.device.type == "cuda":  # the allocator's own high-water mark
            return {
                **self.timings,
                "first_call_s": first,
                "peak_mb": self.torch.cuda.max_memory_allocated() / 2**20,
            }
        peak = resident / (1024 * 1024) + max(_rss_mb() - base, 0.0)
        return {**self.timings, "first_call_s": first, "peak_mb": peak}


def median_spread(samples: list[float]) -> dict[str, float]:
    """Median, min, max and the interquartile range relative to the median."""
    s = sorted(samples)
    med = statistics.median(s)
    if len(s) >= 4:
        q = statistics.quantiles(s, n=4)
        iqr = q[2] - q[0]
    else:
        iqr = s[-1] - s[0]
    return {
        "median": med,
        "min": s[0],
        "max": s[-1],
        "iqr_rel": iqr / med if med else 0.0,
        "n": len(s),
    }


@dataclasses.dataclass
class CpuUse:
    """The process's CPU time and minor page faults over timed calls, summed.

    ``getrusage`` counts every thread of the process: XLA's and PyTorch's worker threads,
    and threads spinning while they wait for work, so ``cores_busy`` is an upper bound on
    the cores doing arithmetic. ``kernel_share`` is the part of that time spent in the
    kernel, mostly first touches of freshly mapped memory; ``faults_per_step`` counts
    those first touches."""

    wall_s: float = 0.0
    user_s: float = 0.0
    system_s: float = 0.0
    minor_faults: int = 0
    steps: int = 0

    def timed(self, run: Callable[[int], float], n: int) -> float:
        """``run(n)`` (seconds per step), its CPU time and faults added to the sums."""
        before, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        per_step = run(n)
        after, t1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        self.wall_s += t1 - t0
        self.user_s += after.ru_utime - before.ru_utime
        self.system_s += after.ru_stime - before.ru_stime
        self.minor_faults += after.ru_minflt - before.ru_minflt
        self.steps += n
        return per_step

    def figures(self) -> dict[str, float]:
        """``cores_busy`` (CPU seconds per wall second), ``kernel_share`` (of the CPU
        time) and ``faults_per_step``; empty before any timed call."""
        cpu = self.user_s + self.system_s
        if not self.steps or self.wall_s <= 0:
            return {}
        return {
            "cores_busy": cpu / self.wall_s,
            "kernel_share": self.system_s / cpu if cpu > 0 else 0.0,
            "faults_per_step": self.minor_faults / self.steps,
        }
