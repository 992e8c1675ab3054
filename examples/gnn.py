"""Classify the nodes of Zachary's karate club (bundled with networkx) by message passing.

    python examples/gnn.py               # a few seconds on 2 CPU cores
    python examples/gnn.py --labelled 1  # one labelled member per club

The 34 members split into two clubs (networkx's ``club`` attribute: "Mr. Hi" or
"Officer"). Only ``--labelled`` members per club keep their label; the task is to
predict the others'. A member has no features but its identity (a one-hot row), so
everything a model can learn about an unlabelled member comes from the friendships. The
model is a two-layer graph convolutional network (Kipf & Welling, 2017): each
``GraphConv`` is a ``Linear`` followed by averaging over the neighbourhood,
``A_hat @ linear(h)``, with ``A_hat = D^-1/2 (A + I) D^-1/2``; the baseline is the same
network without the averaging (an MLP on the features alone).

Both train full-batch with Adam on the labelled members' cross-entropy, on ``--splits``
random choices of the labelled members at once (``jax.vmap`` over splits, ``lax.scan``
over steps, one compiled program). Outputs in ``--out``: ``metrics.json`` (the mean
accuracy on the unlabelled members over the splits, ``gcn_accuracy`` against
``mlp_accuracy`` and the majority club's share ``majority``; ``steps``, ``seconds``) and
``gnn.png``, the graph coloured by the GCN's prediction on the first split. A default run:
the GCN labels about 0.92 of the unlabelled members right, the MLP 0.48 (chance 0.5).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import networkx as nx
import numpy as np
import optax

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

from purelayers import layers as L


@dataclasses.dataclass(frozen=True)
class GraphConv(L.Layer):
    """``adjacency @ linear(x)``: each node's new features average its neighbours'
    (``adjacency`` ``(N, N)`` normalized, ``x`` ``(N, features)``)."""

    linear: L.Linear

    def apply(self, params, x, adjacency, *, key=None, train=False):
        return adjacency @ self.call("linear", params, x)


@dataclasses.dataclass(frozen=True)
class GCN(L.Layer):
    """``conv2(dropout(relu(conv1(x, A))), A)``: node features to class logits."""

    conv1: GraphConv
    dropout: L.Dropout
    conv2: GraphConv

    def apply(self, params, x, adjacency, *, key=None, train=False):
        h = jax.nn.relu(self.call("conv1", params, x, adjacency))
        h = self.call("dropout", params, h, key=key, train=train)
        return self.call("conv2", params, h, adjacency)


def karate_club() -> tuple[nx.Graph, np.ndarray, np.ndarray]:
    """The graph, its normalized adjacency ``D^-1/2 (A + I) D^-1/2`` and the club labels
    (0: "Mr. Hi", 1: "Officer")."""
    graph = nx.karate_club_graph()
    a = nx.to_numpy_array(graph, nodelist=range(len(graph)), weight=None) + np.eye(len(graph))
    d = 1.0 / np.sqrt(a.sum(axis=1))
    labels = np.array([graph.nodes[n]["club"] != "Mr. Hi" for n in graph], np.int32)
    return graph, (a * d[:, None] * d[None, :]).astype(np.float32), labels


def parse_args(argv=None):
    p = common.gallery_parser("gnn", __doc__, steps=200)
    p.add_argument("--labelled", type=common.positive_int, default=2, help="per club")
    p.add_argument("--splits", type=common.positive_int, default=20, help="labelled sets")
    p.add_argument("--hidden", type=common.positive_int, default=16)
    p.add_argument("--dropout", type=float, default=0.5)
    p.add_argument("--lr", type=float, default=0.01)
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    graph, adjacency, labels = karate_club()
    n = len(labels)
    features = np.eye(n, dtype=np.float32)  # identity only
    rng = np.random.default_rng(args.seed)
    masks = np.zeros((args.splits, n), bool)  # the labelled members of each split
    for mask in masks:
        for club in (0, 1):
            mask[rng.choice(np.flatnonzero(labels == club), args.labelled, replace=False)] = True

    gcn = GCN(GraphConv(L.Linear(args.hidden)), L.Dropout(args.dropout), GraphConv(L.Linear(2)))
    mlp = L.Sequential(L.Linear(args.hidden), L.ReLU(), L.Dropout(args.dropout), L.Linear(2))
    models = {  # the MLP ignores the adjacency
        "gcn": (gcn, lambda p, **kw: gcn.apply(p, features, adjacency, **kw)),
        "mlp": (mlp, lambda p, **kw: mlp.apply(p, features, **kw)),
    }
    optimizer = optax.adamw(args.lr, weight_decay=5e-4)

    def train(model, apply, key, mask):
        """``args.steps`` full-batch steps on the members in ``mask``: final logits."""
        params = model.init(
            key, (features.shape, adjacency.shape) if model is gcn else features.shape
        )
        weight = mask / mask.sum()

        def loss(params, key):
            logits = apply(params, key=key, train=True)
            return (optax.softmax_cross_entropy_with_integer_labels(logits, labels) * weight).sum()

        def step(carry, key):
            params, opt_state = carry
            grads = jax.grad(loss)(params, key)
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), None

        keys = jax.random.split(jax.random.fold_in(key, 1), args.steps)
        (params, _), _ = jax.lax.scan(step, (params, optimizer.init(params)), keys)
        return apply(params)

    start = time.perf_counter()
    keys = jax.random.split(jax.random.key(args.seed), args.splits)
    predictions, accuracy = {}, {}
    bar = common.progress(len(models), "gnn")
    for name, (model, apply) in models.items():
        run = jax.jit(jax.vmap(lambda key, mask, m=model, a=apply: train(m, a, key, mask)))
        predictions[name] = np.asarray(run(keys, jnp.asarray(masks))).argmax(-1)
        correct = (predictions[name] == labels) & ~masks
        accuracy[name] = correct.sum(axis=1) / (~masks).sum(axis=1)
        bar.update(1)
    bar.close()
    seconds = time.perf_counter() - start

    metrics = common.write_metrics(
        args.out,
        {
            "gcn_accuracy": float(accuracy["gcn"].mean()),
            "mlp_accuracy": float(accuracy["mlp"].mean()),
            "majority": float(np.bincount(labels).max() / n),
            "gcn_accuracy_split0": float(accuracy["gcn"][0]),
            "labelled_per_club": args.labelled,
            "splits": args.splits,
            "steps": args.steps,
            "seconds": seconds,
        },
    )
    plot(graph, labels, masks[0], predictions["gcn"][0], metrics, args.out / "gnn.png")
    print(f"{args.splits} splits of {2 * args.labelled} labelled members: {seconds:.1f} s")
    print(
        f"accuracy on the unlabelled members: GCN {metrics['gcn_accuracy']:.3f}, "
        f"MLP on features alone {metrics['mlp_accuracy']:.3f} "
        f"(majority club {metrics['majority']:.3f})"
    )
    return metrics


def plot(graph, labels, labelled, predicted, metrics: dict, path) -> None:
    """The club graph coloured by predicted club; labelled members ringed in black,
    wrongly predicted ones in red."""
    fig, ax = common.figure(figsize=(5.5, 4.6))
    pos = nx.spring_layout(graph, seed=3)
    colours = np.array(["tab:blue", "tab:orange"])[predicted]
    edges = np.where(labelled, "black", np.where(predicted != labels, "red", "white"))
    nx.draw_networkx_edges(graph, pos, ax=ax, alpha=0.3)
    nx.draw_networkx_nodes(
        graph, pos, ax=ax, node_color=colours, edgecolors=edges, linewidths=2.5, node_size=180
    )
    nx.draw_networkx_labels(graph, pos, ax=ax, font_size=7)
    ax.set_title(
        f"GCN prediction (blue Mr. Hi, orange Officer); black: labelled, red: wrong\n"
        f"accuracy on unlabelled: GCN {metrics['gcn_accuracy_split0']:.2f} this split, "
        f"{metrics['gcn_accuracy']:.2f} mean; MLP {metrics['mlp_accuracy']:.2f}",
        fontsize=8,
    )
    ax.set_axis_off()
    common.save_figure(fig, path)


if __name__ == "__main__":
    main()
