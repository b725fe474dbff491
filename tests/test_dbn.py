"""Tests for dbn.model.estimator.DBN on a small slice of real MNIST: accuracy, inference API, persistence,
early stopping and progress callbacks."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from dbn import DBN, Network

FAST = dict(pretrain_epochs=5, finetune_epochs=10, top_layer_epochs=2, finetune_learning_rate=0.3,
            device="cpu", seed=0)


@pytest.fixture(scope="module")
def fitted(mnist_small):
    x_train, y_train, _, _ = mnist_small
    records = []
    model = DBN([64, 32], callback=records.append, **FAST).fit(x_train, y_train)
    return model, records


def test_accuracy_well_above_chance(fitted, mnist_small):
    model, _ = fitted
    _, y_train, x_test, y_test = mnist_small
    accuracy = model.score(x_test, y_test)
    assert accuracy > 0.7, accuracy  # chance is ~0.1; this setup reaches ~0.83
    assert model.score(*mnist_small[:2]) >= accuracy - 0.05  # no wild train/test mismatch
    assert model.n_features_in_ == 196 and model.n_classes_ == 10


def test_pretraining_lowered_reconstruction_error(fitted):
    model, _ = fitted
    for layer in (0, 1):
        errors = [r["reconstruction_error"] for r in model.history_
                  if r["phase"] == "pretrain" and r["layer"] == layer]
        assert len(errors) == 5
        assert errors[-1] < 0.85 * errors[0], (layer, errors)
    losses = [r["loss"] for r in model.history_ if r["phase"] == "finetune"]
    assert losses[-1] < 0.5 * losses[0]


def test_predict_shapes_and_probabilities(fitted, mnist_small):
    model, _ = fitted
    x_test = mnist_small[2][:123]
    proba = model.predict_proba(x_test)
    assert isinstance(proba, np.ndarray) and proba.shape == (123, 10)
    assert (proba >= 0).all() and (proba <= 1).all()
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-5)
    predicted = model.predict(x_test)
    assert predicted.shape == (123,) and np.issubdtype(predicted.dtype, np.integer)
    np.testing.assert_array_equal(predicted, proba.argmax(axis=1))
    assert len(np.unique(model.predict(mnist_small[2]))) == 10
    # A single row and a list input work too.
    assert model.predict(x_test[:1].tolist()).shape == (1,)


def test_transform_shape(fitted, mnist_small):
    model, _ = fitted
    features = model.transform(mnist_small[2][:50])
    assert isinstance(features, np.ndarray) and features.shape == (50, 32)
    assert (features > 0).all() and (features < 1).all()  # sigmoid activations
    # It is the fine-tuned network's top hidden layer, computed by hand here.
    h = mnist_small[2][:50].astype(np.float64)
    for w, b in zip(model.network_.weights[:-1], model.network_.biases[:-1]):
        h = 1 / (1 + np.exp(-(h @ w + b)))
    np.testing.assert_allclose(features, h, rtol=1e-4, atol=1e-6)


def test_save_load_round_trip(fitted, mnist_small, tmp_path):
    model, _ = fitted
    x_test = mnist_small[2]
    path = tmp_path / "model.npz"
    model.save(path)
    assert path.is_file()
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left behind

    loaded = DBN.load(path, device="cpu")
    assert loaded.backend.device == "cpu"
    assert loaded.n_features_in_ == model.n_features_in_ and loaded.n_classes_ == model.n_classes_
    params, loaded_params = model.get_params(), loaded.get_params()
    params.pop("device"), loaded_params.pop("device")
    assert params.pop("callback") is not None and loaded_params.pop("callback") is None  # never in the file
    assert loaded_params == params
    np.testing.assert_array_equal(loaded.predict_proba(x_test), model.predict_proba(x_test))
    np.testing.assert_array_equal(loaded.predict(x_test), model.predict(x_test))
    np.testing.assert_array_equal(loaded.transform(x_test[:20]), model.transform(x_test[:20]))
    assert len(loaded.rbms_) == 2
    for a, b in zip(model.rbms_, loaded.rbms_):
        for key in ("weights", "visible_bias", "hidden_bias"):
            assert a.get_state()[key].dtype == b.get_state()[key].dtype
            np.testing.assert_array_equal(a.get_state()[key], b.get_state()[key], err_msg=key)
    for w, v in zip(model.network_.weights + model.network_.biases, loaded.network_.weights + loaded.network_.biases):
        np.testing.assert_array_equal(w, v)
    # Loading with the default device works too (here: the CPU, or the GPU where there is one).
    assert DBN.load(path).predict(x_test[:5]).shape == (5,)


def test_pretrain_only_model_saves_loads_and_finetunes(mnist_small, tmp_path):
    x_train, y_train, x_test, y_test = mnist_small
    model = DBN([32], pretrain_epochs=2, device="cpu", seed=1).pretrain(x_train[:500])
    assert model.network_ is None and len(model.rbms_) == 1
    with pytest.raises(RuntimeError, match="no classifier"):
        model.predict(x_test[:3])
    path = tmp_path / "pretrained.npz"
    model.save(path)
    loaded = DBN.load(path, device="cpu")
    assert loaded.network_ is None and len(loaded.rbms_) == 1
    features = loaded.transform(x_test[:10])
    assert features.shape == (10, 32)
    np.testing.assert_array_equal(features, model.transform(x_test[:10]))
    with pytest.raises(RuntimeError, match="no classifier"):
        loaded.predict_proba(x_test[:3])
    # The loaded stack can be fine-tuned into a working classifier.
    loaded.finetune_epochs, loaded.top_layer_epochs, loaded.finetune_learning_rate = 10, 1, 0.3
    loaded.finetune(x_train[:500], y_train[:500])
    assert isinstance(loaded.network_, Network)
    assert loaded.score(x_test, y_test) > 0.5


def test_unfitted_model_refuses_to_predict_save_or_finetune(tmp_path):
    model = DBN([8], device="cpu")
    with pytest.raises(RuntimeError, match="not fitted"):
        model.transform(np.zeros((2, 4)))
    with pytest.raises(RuntimeError, match="not fitted"):
        model.save(tmp_path / "x.npz")
    with pytest.raises(RuntimeError, match="pre-trained"):
        model.finetune(np.zeros((2, 4)), [0, 1])
    assert not (tmp_path / "x.npz").exists()


EARLY = dict(pretrain_epochs=3, finetune_epochs=15, top_layer_epochs=1, finetune_learning_rate=0.3,
             finetune_lr_decay=2.0,  # the rate doubles every epoch: validation error rises after a few
             validation_fraction=0.2, early_stopping_patience=3, device="cpu", seed=0)


@pytest.fixture(scope="module")
def early_stopped(mnist_small):
    x_train, y_train = mnist_small[:2]
    return DBN([64, 32], **EARLY).fit(x_train, y_train)


def test_early_stopping_records_valid_error_and_stops(early_stopped):
    records = [r for r in early_stopped.history_ if r["phase"] == "finetune"]
    assert all("valid_error" in r and 0 <= r["valid_error"] <= 1 for r in records)
    errors = [r["valid_error"] for r in records]
    best = int(np.argmin(errors))
    assert errors[best] < 0.5
    # It stopped `patience` epochs after the best one, well before finetune_epochs.
    assert len(records) == best + 1 + 3 < 15
    assert [r["epoch"] for r in records] == list(range(len(records)))
    assert all(r["samples"] == 1600 for r in records)  # 80% of 2000 rows train


def test_early_stopping_keeps_best_weights(early_stopped, mnist_small):
    model = early_stopped
    x_train, y_train = mnist_small[:2]
    _, _, x_valid, y_valid = model._split_validation(model.backend.asarray(x_train), y_train)
    best = min(r["valid_error"] for r in model.history_ if r["phase"] == "finetune")
    assert model._error(x_valid, y_valid) == pytest.approx(best)


def test_no_validation_records_without_validation_fraction(fitted):
    model, _ = fitted
    assert not any("valid_error" in r for r in model.history_)


def test_callback_receives_records_of_both_phases(fitted):
    model, records = fitted
    assert records == model.history_
    phases = [r["phase"] for r in records]
    assert phases == ["pretrain"] * 10 + ["finetune"] * 10
    pre = [(r["layer"], r["epoch"]) for r in records if r["phase"] == "pretrain"]
    assert pre == [(layer, epoch) for layer in (0, 1) for epoch in range(5)]
    for r in records:
        assert r["samples"] == 2000 and r["seconds"] >= 0
        if r["phase"] == "finetune":
            assert {"loss", "train_error", "epoch"} <= set(r)
            assert 0 <= r["train_error"] <= 1


def test_same_seed_same_model_on_cpu(mnist_small):
    x, y = mnist_small[0][:300], mnist_small[1][:300]
    kwargs = dict(pretrain_epochs=1, finetune_epochs=2, top_layer_epochs=1, device="cpu")
    a = DBN([16], seed=3, **kwargs).fit(x, y)
    b = DBN([16], seed=3, **kwargs).fit(x, y)
    c = DBN([16], seed=4, **kwargs).fit(x, y)
    for wa, wb in zip(a.network_.weights, b.network_.weights):
        np.testing.assert_array_equal(wa, wb)
    assert not np.array_equal(a.network_.weights[0], c.network_.weights[0])


def test_hyperparameter_validation(mnist_small):
    x, y = mnist_small[0][:50], mnist_small[1][:50]
    cases = [
        (dict(hidden_layers=[]), "hidden_layers"),
        (dict(hidden_layers=[10, 0]), "hidden_layers"),
        (dict(hidden_layers=[10, 5], pretrain_learning_rate=[0.1]), "pretrain_learning_rate has 1 values for 2"),
        (dict(hidden_layers=[10], dropout=1.0), "dropout"),
        (dict(hidden_layers=[10], validation_fraction=-0.1), "validation_fraction"),
    ]
    for kwargs, match in cases:
        model = DBN(**kwargs, device="cpu")  # the constructor only stores its arguments
        with pytest.raises(ValueError, match=match):
            model.validate_params()
        with pytest.raises(ValueError, match=match):
            model.fit(x, y)
        with pytest.raises(ValueError, match=match):
            model.pretrain(x)
    assert DBN([10, 5], pretrain_learning_rate=[0.1, 0.05], device="cpu").validate_params().hidden_layers == [10, 5]


def test_get_params_set_params_and_clone():
    """scikit-learn's estimator contract: the hyperparameters are __init__'s arguments, stored as given."""
    layers, rates, callback = (8, 4), [0.1, 0.05], print
    model = DBN(layers, pretrain_learning_rate=rates, dropout=0.25, device="cpu", seed=7, callback=callback)
    params = model.get_params()
    assert list(params) == list(inspect.signature(DBN).parameters) == DBN._param_names()
    assert params["hidden_layers"] is layers and params["pretrain_learning_rate"] is rates
    assert params["callback"] is callback and params["seed"] == 7 and params["device"] == "cpu"
    assert model.get_params(deep=False) == params
    # clone: a new estimator from get_params has equal params, and the very same objects.
    clone = DBN(**model.get_params(deep=False))
    assert all(clone.get_params()[name] is value for name, value in params.items())
    assert not clone.rbms_ and clone.network_ is None

    assert model.set_params(finetune_epochs=3, dropout=0.5) is model
    assert model.finetune_epochs == 3 and model.get_params()["dropout"] == 0.5
    with pytest.raises(ValueError, match="invalid parameter 'n_layers'"):
        model.set_params(n_layers=2)
    # The backend is made on first use, afresh after a new device or seed.
    backend = model.backend
    assert model.backend is backend and backend.device == "cpu"
    model.set_params(seed=8)
    assert model.backend is not backend


def test_per_layer_pretrain_rates_reach_the_rbms(mnist_small):
    model = DBN([8, 4], pretrain_learning_rate=[0.2, 0.05], pretrain_epochs=1, device="cpu").pretrain(mnist_small[0][:100])
    assert [rbm.learning_rate for rbm in model.rbms_] == [0.2, 0.05]
    assert model.pretrain_learning_rate == [0.2, 0.05]
    shared = DBN([8, 4], pretrain_learning_rate=0.3, pretrain_epochs=1, device="cpu").pretrain(mnist_small[0][:100])
    assert [rbm.learning_rate for rbm in shared.rbms_] == [0.3, 0.3] and shared.pretrain_learning_rate == 0.3


def test_finetune_schedule_decays_the_rate_and_ramps_the_momentum():
    model = DBN([8], finetune_learning_rate=1.0, finetune_lr_decay=0.5, finetune_momentum=0.5,
                finetune_final_momentum=0.99, finetune_momentum_epochs=10)
    assert model.finetune_schedule(0) == (1.0, 0.5)
    rate, momentum = model.finetune_schedule(5)
    assert rate == 1 / 32 and momentum == pytest.approx(0.745)
    assert model.finetune_schedule(10)[1] == model.finetune_schedule(50)[1] == 0.99
    steady = DBN([8], finetune_momentum=0.8)  # no final momentum: the same momentum every epoch
    assert {steady.finetune_schedule(e) for e in (0, 3, 99)} == {(0.1, 0.8)}


@pytest.mark.parametrize("params, named", [
    (dict(max_norm=-1.0), "max_norm"),
    (dict(finetune_final_momentum=1.0), "finetune_final_momentum"),
    (dict(finetune_momentum=1.2), "finetune_momentum"),
    (dict(finetune_momentum_epochs=-3), "finetune_momentum_epochs"),
])
def test_bad_finetune_recipe_values_are_refused_by_name(params, named):
    with pytest.raises(ValueError, match=named):
        DBN([8], **params).validate_params()


def test_fit_warns_when_the_rows_make_few_minibatches_an_epoch():
    """sklearn users fit a DBN on a few hundred rows with the paper's batch of 100: a handful of
    updates an epoch, and a model at chance level. fit says so and with what batch size."""
    import warnings

    X = (np.random.default_rng(0).random((150, 20)) < 0.3).astype(np.float32)
    y = np.arange(150) % 2
    model = DBN(hidden_layers=[8], pretrain_epochs=1, finetune_epochs=2, device="cpu")
    with pytest.warns(UserWarning, match=r"X: 150 rows make few minibatches an epoch \(pretrain_batch_size 100 "
                                         r"makes 1 \(1 epoch: 1 update\); finetune_batch_size 100 makes 1 \(2 epochs: "
                                         r"2 updates\)\), .* e\.g\. DBN\(pretrain_batch_size=15, finetune_batch_size=15\)"):
        model.fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 10 minibatches of 15 an epoch: nothing to say
        model.set_params(pretrain_batch_size=15, finetune_batch_size=15).fit(X, y)
