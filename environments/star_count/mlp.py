"""A one-hidden-layer ReLU regressor trained with Adam, in numpy alone.

It replaced scikit-learn's ``MLPRegressor`` (issue 13): importing scikit-learn was most of each
experiment's start-up, and the runner's verifying evaluation unpickled it again. This is the same
model and optimiser (Glorot-uniform initialisation, minibatches reshuffled every epoch, Adam with
bias correction, L2 penalty ``alpha``, squared loss), in float32, saved as a plain ``.npz`` of
weights that loads without pickle — so an evaluation never runs code from a file an agent wrote.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

BETA1, BETA2, EPSILON = 0.9, 0.999, 1e-8


class MLP:
    """``predict(X) = relu(X @ W1 + b1) @ W2 + b2``; ``fit_epoch`` is one pass over the data."""

    def __init__(self, n_in: int, hidden: int, n_out: int, lr: float, alpha: float = 1e-4, seed: int = 0):
        self.rng = np.random.RandomState(seed)
        self._hold([*self._glorot(n_in, hidden), *self._glorot(hidden, n_out)], lr, alpha)

    @classmethod
    def from_weights(cls, weights: list[np.ndarray]) -> MLP:
        """A model holding ``weights`` (W1, b1, W2, b2), for prediction. No initialisation: that
        imports numpy.random, a tenth of the runner's evaluation apart from numpy itself."""
        model = cls.__new__(cls)
        model._hold(weights, lr=0.0, alpha=1e-4)
        return model

    def _hold(self, initial: list[np.ndarray], lr: float, alpha: float) -> None:
        self.lr, self.alpha = lr, alpha
        # One flat buffer for the weights (W1, b1, W2, b2 are views into it) and one for their
        # gradients: Adam's update is then a few vector operations, not a few per array.
        self.flat = np.concatenate([a.ravel() for a in initial])
        self.params = self._views(self.flat, initial)
        self.grad = np.zeros_like(self.flat)
        self.grads = self._views(self.grad, initial)
        self.m = np.zeros_like(self.flat)
        self.v = np.zeros_like(self.flat)
        self._a, self._b = np.empty_like(self.flat), np.empty_like(self.flat)  # Adam's scratch
        self._update = np.empty(self.flat.shape, dtype=np.float64)
        self._batch: np.ndarray | None = None
        self.t = 0
        self.loss = float("nan")

    @staticmethod
    def _views(flat: np.ndarray, shapes_of: list[np.ndarray]) -> list[np.ndarray]:
        views, start = [], 0
        for array in shapes_of:
            views.append(flat[start : start + array.size].reshape(array.shape))
            start += array.size
        return views

    def _glorot(self, fan_in: int, fan_out: int) -> list[np.ndarray]:
        bound = np.sqrt(6.0 / (fan_in + fan_out))
        weights = self.rng.uniform(-bound, bound, (fan_in, fan_out)).astype(np.float32)
        bias = self.rng.uniform(-bound, bound, fan_out).astype(np.float32)
        return [weights, bias]

    def predict(self, X: np.ndarray) -> np.ndarray:
        W1, b1, W2, b2 = self.params
        return np.maximum(X @ W1 + b1, 0.0) @ W2 + b2

    def fit_epoch(self, X: np.ndarray, Y: np.ndarray, batch_size: int) -> float:
        """One shuffled pass of minibatches; returns (and keeps in ``loss``) the epoch's mean loss."""
        n = len(X)
        order = self.rng.permutation(n)
        # The batch and Adam's temporaries in buffers kept from step to step: allocated anew, each
        # (~0.4 MB and up) was a fresh mmap that glibc handed back at once, and faulting in the same
        # pages again every step was ~45% of training (1.7 s of system time in a 3.3 s run).
        if self._batch is None or self._batch.shape[0] < batch_size or self._batch.shape[1:] != X.shape[1:]:
            self._batch = np.empty((batch_size, *X.shape[1:]), dtype=X.dtype)
        total = 0.0
        for start in range(0, n, batch_size):
            index = order[start : start + batch_size]
            batch = np.take(X, index, axis=0, out=self._batch[: len(index)])
            total += self._step(batch, Y[index]) * len(index)
        self.loss = total / n
        return self.loss

    def _step(self, X: np.ndarray, Y: np.ndarray) -> float:
        W1, b1, W2, b2 = self.params
        n = len(X)
        hidden = np.maximum(X @ W1 + b1, 0.0)
        error = hidden @ W2 + b2 - Y
        penalty = 0.5 * self.alpha * (np.vdot(W1, W1) + np.vdot(W2, W2)) / n
        loss = float(np.mean(error * error)) / 2 + float(penalty)
        back = (error @ W2.T) * (hidden > 0)
        gW1, gb1, gW2, gb2 = self.grads
        np.matmul(X.T, back, out=gW1)
        gW1 += self.alpha * W1
        gW1 /= n
        np.mean(back, axis=0, out=gb1)
        np.matmul(hidden.T, error, out=gW2)
        gW2 += self.alpha * W2
        gW2 /= n
        np.mean(error, axis=0, out=gb2)
        self.t += 1
        step = self.lr * np.sqrt(1 - BETA2**self.t) / (1 - BETA1**self.t)
        # Adam, each operation in the order and precision (so with the rounding) of
        #   m = BETA1 m + (1 - BETA1) g;  v = BETA2 v + (1 - BETA2) g g;  w -= step m / (sqrt(v) + eps)
        # where `step` is a float64, so is the update before it is subtracted.
        g, m, v, a, b, update = self.grad, self.m, self.v, self._a, self._b, self._update
        m *= BETA1
        np.multiply(g, 1 - BETA1, out=a)
        m += a
        v *= BETA2
        np.multiply(g, 1 - BETA2, out=a)
        a *= g
        v += a
        np.multiply(m, step, out=update)
        np.sqrt(v, out=b)
        b += EPSILON
        update /= b
        self.flat -= update
        return loss

    def save(self, path: Path, **meta: Any) -> None:
        """Weights and ``meta`` (plain values) as an npz, written whole or not at all."""
        tmp = path.with_name(path.name + ".tmp")
        with tmp.open("wb") as f:
            np.savez(f, W1=self.params[0], b1=self.params[1], W2=self.params[2], b2=self.params[3], **meta)
        tmp.replace(path)


def load(path: Path) -> tuple[MLP, dict[str, Any]]:
    """The model saved at ``path`` and its meta values; never unpickles (``allow_pickle=False``)."""
    with np.load(path, allow_pickle=False) as data:
        arrays = {key: data[key] for key in data.files}
    weights = [arrays.pop(key).astype(np.float32) for key in ("W1", "b1", "W2", "b2")]
    return MLP.from_weights(weights), {
        key: value.item() if value.ndim == 0 else value for key, value in arrays.items()
    }
