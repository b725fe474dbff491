"""Softmax (multinomial logistic) regression as an IterativeReduce program: the runtime's tests' own.

Each superstep, every shard takes ``local_steps`` gradient steps from the current
parameters (full shard per step when ``batch_size`` is 0, else minibatches), and
the master averages the results by sample count. With one full-batch step and
equal shards this is exactly full-batch gradient descent on the union.
"""

from __future__ import annotations

import numpy as np

from iterreduce.program import Program, Step, Update, WorkerProgram
from shardio.readers import read_shard

ARRAYS = ("weights", "bias")


class SoftmaxRegression(Program):
    worker_class = "softmax_program:SoftmaxWorker"
    reader = "shardio.readers:ShardFiles"

    def initial_parameters(self, seed, shards):
        n_features = shards[0]["features"]
        n_classes = int(self.config["n_classes"])
        rng = np.random.default_rng(seed)
        return {"weights": (0.01 * rng.standard_normal((n_features, n_classes))).astype(np.float32),
                "bias": np.zeros(n_classes, np.float32)}

    def schedule(self, shards):
        for epoch in range(int(self.config.get("epochs", 10))):
            yield Step("train", {"epoch": epoch}, ARRAYS)

    def runs_ahead(self, step, following):
        return True  # a worker's run reads its parameters and its shard, and keeps nothing


class SoftmaxWorker(WorkerProgram):
    def load_shard(self, uri, index):
        return read_shard(uri, index)

    def run(self, step: Step, parameters, shard, seed) -> Update:
        W = parameters["weights"].astype(np.float64)
        b = parameters["bias"].astype(np.float64)
        if shard.labels is None:
            raise ValueError(f"{shard.uri}: softmax regression needs a 'label' column")
        X, y = shard.features.astype(np.float64), shard.labels
        lr = float(self.config.get("learning_rate", 0.5))
        batch = int(self.config.get("batch_size", 0)) or X.shape[0]
        order = np.random.default_rng(seed).permutation(X.shape[0]) if batch < X.shape[0] else np.arange(X.shape[0])
        for _ in range(int(self.config.get("local_steps", 1))):
            for start in range(0, X.shape[0] - batch + 1, batch):
                idx = order[start:start + batch]
                p = softmax(X[idx] @ W + b)
                p[np.arange(len(idx)), y[idx]] -= 1.0
                W -= lr * X[idx].T @ p / len(idx)
                b -= lr * p.mean(axis=0)
        probs = softmax(X @ W + b)
        loss = -float(np.mean(np.log(probs[np.arange(len(y)), y] + 1e-12)))
        error = float(np.mean(probs.argmax(axis=1) != y))
        return Update(shard.index, X.shape[0], {"weights": W.astype(np.float32), "bias": b.astype(np.float32)},
                      {"loss": loss, "train_error": error})


def softmax(z):
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)
