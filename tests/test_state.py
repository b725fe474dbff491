"""Tests for dbn.model.state: one naming scheme from the estimator to the runtime, the checkpoint and the model file."""

from __future__ import annotations

import numpy as np
import pytest

from conftest_runtime import DBN_PROGRAM, InProcessJob, load_npz, simulate
from dbn import DBN, RBM
from dbn.jobs.dbn_program import DBNProgram, dbn_params
from dbn.model import persist, state
from iterreduce.master import checkpoint
from shardio.readers import shard_info
from shardio.shards import write_shards

SMALL = dict(pretrain_epochs=2, finetune_epochs=3, top_layer_epochs=1, finetune_learning_rate=0.3, device="cpu", seed=0)


@pytest.fixture(scope="module")
def fitted(mnist_small):
    x_train, y_train = mnist_small[0][:400], mnist_small[1][:400]
    return DBN([16, 8], pretrain_learning_rate=[0.1, 0.05], **SMALL).fit(x_train, y_train)


def test_names():
    assert state.rbm_names(1) == ("rbm.1.weights", "rbm.1.visible_bias", "rbm.1.hidden_bias",
                                  "rbm.1.weights_inc", "rbm.1.visible_bias_inc", "rbm.1.hidden_bias_inc")
    assert state.net_names(3, range(2, 3)) == ("net.2.weights", "net.2.biases", "net.2.weights_inc", "net.2.biases_inc")
    assert len(state.net_names(3)) == 12 and state.net_names(3)[:2] == ("net.0.weights", "net.0.biases")
    assert [state.is_increment(n) for n in ("rbm.0.weights_inc", "net.1.biases_inc", "net.1.biases")] == [True, True, False]
    # An RBM's own keys are the codec's list, in the codec's order.
    rbm = RBM(3, device="cpu").initialize(n_visible=4)
    assert tuple(rbm.get_state()) == state.RBM_KEYS
    named = state.named_rbm_state(2, rbm.get_state())
    assert tuple(named) == state.rbm_names(2)
    assert state.rbm_state({**named, "net.0.weights": 0}, 2).keys() == rbm.get_state().keys()
    # Increments are optional, parameters are not.
    assert set(state.rbm_state({k: v for k, v in named.items() if not state.is_increment(k)}, 2)) == \
        {"weights", "visible_bias", "hidden_bias"}
    with pytest.raises(KeyError, match="rbm.2.hidden_bias"):
        state.rbm_state({k: v for k, v in named.items() if k != "rbm.2.hidden_bias"}, 2)


def test_logit_is_the_visible_bias_of_rbm_and_program(bas_data):
    mean = bas_data.mean(axis=0)
    expected = state.logit(mean)
    p = np.clip(mean, 1e-3, 1 - 1e-3)
    np.testing.assert_allclose(expected, np.log(p / (1 - p)))
    np.testing.assert_allclose(state.logit(np.array([0.0, 0.5, 1.0])), [np.log(1e-3 / 0.999), 0.0, np.log(0.999 / 1e-3)])
    rbm = RBM(4, device="cpu").initialize(bas_data)
    np.testing.assert_array_equal(rbm.visible_bias_, state.logit(mean).astype(np.float32))


def test_dbn_to_state_and_back_predicts_the_same(fitted, mnist_small):
    x_test = mnist_small[2]
    arrays = fitted.get_state()
    n = len(fitted.hidden_layers)
    assert set(arrays) == {*state.rbm_names(0), *state.rbm_names(1), *state.net_names(n + 1)}
    assert all(isinstance(v, np.ndarray) for v in arrays.values())
    assert set(fitted.get_state(increments=False)) == {k for k in arrays if not state.is_increment(k)}

    model = DBN(**fitted.get_params()).set_state(arrays)
    assert model.n_features_in_ == fitted.n_features_in_ and model.n_classes_ == fitted.n_classes_ == 10
    np.testing.assert_array_equal(model.predict_proba(x_test), fitted.predict_proba(x_test))
    np.testing.assert_array_equal(model.transform(x_test[:20]), fitted.transform(x_test[:20]))
    for key, value in model.get_state().items():  # increments included
        np.testing.assert_array_equal(value, arrays[key], err_msg=key)
    assert [rbm.learning_rate for rbm in model.rbms_] == [0.1, 0.05]

    # A pre-trained stack: RBMs, no network; the initial softmax weights alone make no network.
    pretrained = {k: v for k, v in arrays.items() if k.startswith("rbm.")}
    pretrained["net.2.weights"] = np.zeros((8, 10), np.float32)
    stack = DBN(**fitted.get_params()).set_state(pretrained)
    assert stack.network_ is None and len(stack.rbms_) == 2 and not hasattr(stack, "n_classes_")
    assert stack.transform(x_test[:5]).shape == (5, 8)


def test_finetune_start_is_the_pretrained_stack_plus_the_softmax_layer(mnist_small):
    x, y = mnist_small[0][:200], mnist_small[1][:200]
    model = DBN([12, 6], pretrain_epochs=1, finetune_epochs=0, device="cpu").fit(x)  # pre-training only
    assert model.network_ is None
    model.finetune(x, y)  # no epochs: the network as it starts
    start = model.network_.get_state()
    pretrained = model.get_state(increments=False)
    for i in range(2):
        np.testing.assert_array_equal(start[f"net.{i}.weights"], pretrained[f"rbm.{i}.weights"])
        np.testing.assert_array_equal(start[f"net.{i}.biases"], pretrained[f"rbm.{i}.hidden_bias"])
    assert start["net.2.weights"].shape == (6, 10) and not start["net.2.biases"].any()
    assert not any(v.any() for k, v in start.items() if state.is_increment(k))
    # finetune_start builds the same from the RBMs and the softmax weights (as the program's before_step does).
    rbms_only = {k: v for k, v in pretrained.items() if k.startswith("rbm.")}
    again = state.finetune_start({**rbms_only, "net.2.weights": start["net.2.weights"]}, 2)
    assert again.keys() == start.keys()
    for key, value in again.items():
        assert value.dtype == start[key].dtype and np.array_equal(value, start[key]), key


def test_same_names_in_program_checkpoint_and_model_file(tmp_path, mnist_small):
    x, y = mnist_small[0][:200], mnist_small[1][:200]
    uris = write_shards(x, y, str(tmp_path / "shards"), 2)
    config = dict(hidden_layers=[12, 6], pretrain_epochs=1, finetune_epochs=2, top_layer_epochs=1, n_classes=10, seed=0)
    job = InProcessJob(tmp_path / "out", uris, workers=2, program=DBN_PROGRAM, program_config=config,
                       checkpoint_dir=str(tmp_path / "ckpt"))
    job.run_to_end("w0", "w1")

    names = {*state.rbm_names(0), *state.rbm_names(1), *state.net_names(3)}
    steps = list(DBNProgram(config).schedule(shard_info(uris)))
    assert {name for step in steps for name in step.arrays} == names  # what the runtime averages
    _, checkpointed = checkpoint.load(checkpoint.latest(str(tmp_path / "ckpt")))
    assert set(checkpointed) == names
    simulated = simulate(DBN_PROGRAM, config, uris)
    assert set(simulated) == names
    saved = load_npz(tmp_path / "out" / "model.npz")
    header = saved.pop("__header__")
    assert b'"version": 2' in header.tobytes() and b"callback" not in header.tobytes()
    assert set(saved) == {name for name in names if not state.is_increment(name)}
    for name, value in saved.items():
        assert value.dtype == checkpointed[name].dtype and np.array_equal(value, checkpointed[name]), name
    model = DBN.load(tmp_path / "out" / "model.npz", device="cpu")
    assert set(model.get_state(increments=False)) == set(saved)
    assert dbn_params({**config, "device": "gpu", "callback": print, "sync_every": 2}) == config


def _version_1_file(model, path):
    """``model`` as the version-1 format wrote it: network.weights.{i} / network.biases.{i}, no _inc arrays."""
    arrays = {}
    for layer, rbm in enumerate(model.rbms_):
        for key in ("weights", "visible_bias", "hidden_bias"):
            arrays[f"rbm.{layer}.{key}"] = rbm.get_state()[key]
    if model.network_ is not None:
        for i, (w, b) in enumerate(zip(model.network_.weights, model.network_.biases)):
            arrays[f"network.weights.{i}"], arrays[f"network.biases.{i}"] = w, b
    params = {k: v for k, v in model.get_params().items() if k != "callback"}
    params["pretrain_learning_rate"] = [float(r) for r in model.pretrain_rates()]  # version 1 kept one per layer
    header = {"version": 1, "params": params, "n_features_in": model.n_features_in_,
              "n_classes": getattr(model, "n_classes_", None), "n_rbms": len(model.rbms_),
              "has_network": model.network_ is not None}
    persist.save_arrays(path, header, arrays)


def test_version_1_model_file_still_loads_and_predicts_the_same(fitted, mnist_small, tmp_path):
    x_test = mnist_small[2]
    _version_1_file(fitted, tmp_path / "v1.npz")
    header, arrays = persist.load_arrays(tmp_path / "v1.npz")
    assert header["version"] == 1 and "network.weights.2" in arrays and "net.2.weights" not in arrays

    loaded = DBN.load(tmp_path / "v1.npz", device="cpu")
    assert loaded.n_features_in_ == 196 and loaded.n_classes_ == 10 and loaded.hidden_layers == [16, 8]
    np.testing.assert_array_equal(loaded.predict_proba(x_test), fitted.predict_proba(x_test))
    np.testing.assert_array_equal(loaded.transform(x_test[:20]), fitted.transform(x_test[:20]))
    # Saved again, it is a version-2 file with today's names.
    loaded.save(tmp_path / "v2.npz")
    header, arrays = persist.load_arrays(tmp_path / "v2.npz")
    assert header["version"] == persist.VERSION == 2 and "net.2.weights" in arrays and "network.weights.2" not in arrays
    np.testing.assert_array_equal(DBN.load(tmp_path / "v2.npz", device="cpu").predict_proba(x_test),
                                  fitted.predict_proba(x_test))


def test_version_1_pretrained_stack_loads(mnist_small, tmp_path):
    x = mnist_small[0][:200]
    model = DBN([8], pretrain_epochs=1, device="cpu", seed=2).pretrain(x)
    _version_1_file(model, tmp_path / "v1.npz")
    loaded = DBN.load(tmp_path / "v1.npz", device="cpu")
    assert loaded.network_ is None and len(loaded.rbms_) == 1
    np.testing.assert_array_equal(loaded.transform(x), model.transform(x))


@pytest.mark.parametrize("missing, match", [
    ("net.", "has_network"),  # the whole network: the header says there is one
    ("net.2.weights", "inconsistent.*net.2.weights"),  # the softmax layer: no shorter network is made up
    ("rbm.1.hidden_bias", "inconsistent.*rbm.1.hidden_bias"),
])
def test_model_file_with_missing_arrays_is_refused(fitted, tmp_path, missing, match):
    path = tmp_path / "m.npz"
    fitted.save(path)
    header, arrays = persist.load_arrays(path)
    kept = {k: v for k, v in arrays.items() if not k.startswith(missing)}
    persist.save_arrays(path, {k: v for k, v in header.items() if k not in ("format", "version")}, kept)
    with pytest.raises(persist.ModelFileError, match=match):
        DBN.load(path, device="cpu")
