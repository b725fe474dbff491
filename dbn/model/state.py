"""The flat named state: one name for each array a DBN learns, from the estimator to the file.

The runtime averages, checkpoints and ships named arrays, and the model file stores
them; this module maps the estimators' learned arrays to those names and back. The
one naming scheme, for the program's parameters, the checkpoints and the model file
alike (``l`` and ``i`` count layers from 0 at the data)::

    rbm.{l}.weights          (n_visible, n_hidden)  the RBM of hidden layer l
    rbm.{l}.visible_bias     (n_visible,)
    rbm.{l}.hidden_bias      (n_hidden,)
    rbm.{l}.weights_inc, rbm.{l}.visible_bias_inc, rbm.{l}.hidden_bias_inc   their momentum increments
    net.{i}.weights          (n_in, n_out)          layer i of the fine-tuned network (the last: softmax)
    net.{i}.biases           (n_out,)
    net.{i}.weights_inc, net.{i}.biases_inc         their momentum increments

An :class:`~dbn.model.rbm.RBM` does not know its layer: its ``get_state`` /
``set_state`` use the keys :data:`RBM_KEYS` (``weights``, ...), which
:func:`rbm_state` and :func:`named_rbm_state` translate. There is one network,
so :class:`~dbn.model.network.Network` uses the full ``net.{i}.*`` names
(``Network.from_state`` builds one), and :meth:`DBN.get_state
<dbn.model.estimator.DBN.get_state>` / ``set_state`` put the two together: what
``DBN.save`` / ``DBN.load`` and the distributed program's final model share.

Model files (format version 2) hold these names without the increments. Version 1
called the network's arrays ``network.weights.{i}`` and ``network.biases.{i}``;
:func:`from_version_1` renames them.
"""

from __future__ import annotations

import numpy as np

RBM_KEYS = ("weights", "visible_bias", "hidden_bias", "weights_inc", "visible_bias_inc", "hidden_bias_inc")
NET_KEYS = ("weights", "biases", "weights_inc", "biases_inc")


def rbm_name(layer: int, key: str) -> str:
    """The flat name of an RBM array: ``rbm_name(1, "weights") == "rbm.1.weights"``."""
    return f"rbm.{layer}.{key}"


def net_name(layer: int, key: str) -> str:
    """The flat name of a network array: ``net_name(2, "biases") == "net.2.biases"``."""
    return f"net.{layer}.{key}"


def rbm_names(layer: int) -> tuple[str, ...]:
    """The names of layer ``layer``'s RBM arrays, increments included."""
    return tuple(rbm_name(layer, key) for key in RBM_KEYS)


def net_names(n_layers: int, only: range | None = None) -> tuple[str, ...]:
    """The names of a network's arrays, increments included: of all ``n_layers`` layers, or those in ``only``."""
    layers = range(n_layers) if only is None else only
    return tuple(net_name(i, key) for i in layers for key in NET_KEYS)


def is_increment(name: str) -> bool:
    """True for momentum increments (optimizer state, not part of a trained model)."""
    return name.endswith("_inc")


def logit(mean, xp=np):
    """log(p / (1 - p)) of the mean ``p`` clipped to [0.001, 0.999]: Bernoulli visible biases start
    there, so that an RBM with zero weights reproduces the data's mean (Hinton's practical guide)."""
    p = xp.clip(mean, 1e-3, 1 - 1e-3)
    return xp.log(p / (1 - p))


# ------------------------------------------------------------------ layers

def rbm_state(state: dict, layer: int) -> dict:
    """Layer ``layer``'s RBM arrays in ``state`` under the RBM's own keys (for ``RBM.set_state``).

    The parameters must be there (KeyError naming the array otherwise); increments are taken where present.
    """
    return {key: state[name] for key, name in zip(RBM_KEYS, rbm_names(layer))
            if name in state or not is_increment(key)}


def named_rbm_state(layer: int, arrays: dict) -> dict:
    """An RBM's ``get_state()`` under the flat names of layer ``layer``."""
    return {rbm_name(layer, key): value for key, value in arrays.items()}


def finetune_start(state: dict, n_hidden_layers: int) -> dict:
    """The fine-tuning network's first state, from a state of ``n_hidden_layers`` pre-trained RBMs.

    Hidden layer i starts as RBM i (its weights and hidden biases), the softmax layer
    n = ``n_hidden_layers`` from the weights ``net.{n}.weights`` in ``state`` with zero
    biases, and every increment at zero. Host NumPy arrays in, host arrays out.
    """
    n = n_hidden_layers
    net = {}
    for i in range(n):
        net[net_name(i, "weights")] = state[rbm_name(i, "weights")].copy()
        net[net_name(i, "biases")] = state[rbm_name(i, "hidden_bias")].copy()
    softmax = state[net_name(n, "weights")]
    net[net_name(n, "weights")] = softmax
    net[net_name(n, "biases")] = np.zeros(softmax.shape[1], softmax.dtype)
    for i in range(n + 1):
        net[net_name(i, "weights_inc")] = np.zeros_like(net[net_name(i, "weights")])
        net[net_name(i, "biases_inc")] = np.zeros_like(net[net_name(i, "biases")])
    return net


def from_version_1(arrays: dict) -> dict:
    """The arrays of a version-1 model file under today's names (``network.weights.{i}`` ->
    ``net.{i}.weights``, ``network.biases.{i}`` -> ``net.{i}.biases``; RBM names are unchanged)."""
    renamed = {}
    for name, value in arrays.items():
        prefix, _, layer = name.rpartition(".")
        if prefix in ("network.weights", "network.biases"):
            if not (layer.isascii() and layer.isdigit()):
                raise ValueError(f"array {name!r}: {layer!r} is no layer number")
            name = net_name(int(layer), prefix.removeprefix("network."))
        renamed[name] = value
    return renamed


def _layers(arrays: dict, kind: str) -> list[int]:
    """The layer numbers ``l`` of the arrays named ``{kind}.{l}.weights`` in ``arrays``, sorted."""
    layers = []
    for name in arrays:
        parts = name.split(".")
        if (len(parts) == 3 and parts[0] == kind and parts[2] == "weights" and parts[1].isascii()
                and parts[1].isdigit() and parts[1] == str(int(parts[1]))):
            layers.append(int(parts[1]))
    return sorted(layers)


def check_state(arrays: dict) -> None:
    """Check that the shapes in a flat state fit together; a ValueError names the array at fault.

    For each RBM layer ``l`` whose weights are there: ``rbm.{l}.weights`` is (n_visible, n_hidden)
    with no dimension 0, the biases are (n_visible,) and (n_hidden,), each increment has the shape
    of its parameter, and layer ``l`` takes what layer ``l - 1`` gives. The same for the network
    (``net.{i}.biases`` is (n_out,)); its first layer takes the first RBM's inputs, and a hidden
    layer ``i`` (one the network has a layer after) has the shape of RBM ``i``, whose weights it
    starts from. Arrays that are missing are not checked here (their user names them).
    """
    def expect(name, shape, why):
        if name in arrays and tuple(arrays[name].shape) != tuple(shape):
            raise ValueError(f"array {name!r} has shape {tuple(arrays[name].shape)}, expected {tuple(shape)} ({why})")

    def weights(name):
        w = arrays[name]
        if w.ndim != 2 or 0 in w.shape:
            raise ValueError(f"array {name!r} has shape {tuple(w.shape)}, expected (inputs, units) of at least 1 each")
        return w.shape

    rbms = {layer: weights(rbm_name(layer, "weights")) for layer in _layers(arrays, "rbm")}
    for layer, (n_in, n_out) in rbms.items():
        w = rbm_name(layer, "weights")
        expect(rbm_name(layer, "visible_bias"), (n_in,), f"the rows of {w!r}")
        expect(rbm_name(layer, "hidden_bias"), (n_out,), f"the columns of {w!r}")
        for key in ("weights", "visible_bias", "hidden_bias"):
            param = rbm_name(layer, key)
            if param in arrays:
                expect(rbm_name(layer, key + "_inc"), arrays[param].shape, f"that of {param!r}")
        if layer - 1 in rbms:
            expect(w, (rbms[layer - 1][1], n_out), f"the inputs of layer {layer} are the units of layer {layer - 1}")
    net = {i: weights(net_name(i, "weights")) for i in _layers(arrays, "net")}
    for i, (n_in, n_out) in net.items():
        w = net_name(i, "weights")
        expect(net_name(i, "biases"), (n_out,), f"the columns of {w!r}")
        for key in ("weights", "biases"):
            param = net_name(i, key)
            if param in arrays:
                expect(net_name(i, key + "_inc"), arrays[param].shape, f"that of {param!r}")
        if i - 1 in net:
            expect(w, (net[i - 1][1], n_out), f"the inputs of layer {i} are the units of layer {i - 1}")
        if i == 0 and 0 in rbms:
            expect(w, (rbms[0][0], n_out), f"the network takes the inputs of {rbm_name(0, 'weights')!r}")
        if i in rbms and i + 1 in net:
            expect(w, rbms[i], f"hidden layer {i} of the network starts as RBM {i}")
