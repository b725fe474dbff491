"""`dbn export --format onnx` whatever the model's columns are called (issue 51, class 9): a column
named like one of the graph's own values (``rows``, ``b0``, ``W0``, ``hidden0``...) or like an output
(``label``, ``probabilities``) once made a file ONNX Runtime refused, or an onnx ValidationError. The
exported graph loads in ONNX Runtime and answers what DBN.predict and predict_proba do, for any names;
an error of onnx or ONNX Runtime at export is a known CLI error naming the columns."""

from __future__ import annotations

import functools

import numpy as np
import pytest

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from dbn import DBN  # noqa: E402
from dbn.cli import main  # noqa: E402
from dbn.model.onnx_export import to_onnx  # noqa: E402
from dbn.model.scaler import Scaler  # noqa: E402

TOLERANCE = 1e-5
#: Every name the graph of a scaled, three-layer model used for its own values, its outputs and the
#: input of the features, and the prefix of its own names now.
GRAPH_NAMES = ["rows", "rows64", "centred", "scaled64", "clipped", "scaled", "scaler_offset", "scaler_scale",
               "zero", "one", *(f"{kind}{i}" for kind in ("W", "b", "product", "input", "hidden") for i in range(3)),
               "class_index", "classes", "label", "probabilities", "features", "dbn/rows", "dbn/W0", "dbn/"]
ROWS = np.random.default_rng(7).normal(5.0, 3.0, (40, 4))  # raw rows, far from [0, 1]: the scaler matters


@functools.lru_cache(maxsize=None)
def fitted(n_features: int) -> DBN:
    """A small classifier of ``n_features`` features (two hidden layers), fitted once a width."""
    rng = np.random.default_rng(n_features)
    X = rng.random((60, n_features)).astype(np.float32)
    model = DBN(hidden_layers=[5, 4], pretrain_epochs=1, finetune_epochs=2, pretrain_batch_size=10,
                finetune_batch_size=10, seed=1, device="cpu")
    return model.fit(X, np.arange(60) % 3)


def with_columns(columns: list[str], kind: str = "min_max") -> DBN:
    """The fitted model of ``len(columns)`` features, reading ``columns`` (a scaler and string classes too)."""
    model = fitted(len(columns))
    # min-max clips some of ROWS; the standard scaler keeps them in the [0, 1] Bernoulli units need
    at = {"min_max": (2.0, 0.1), "standard": (-10.0, 1 / 30)}[kind]
    offset, scale = np.full(len(columns), at[0]), np.full(len(columns), at[1])
    return model.set_inputs(scaler=Scaler(kind, offset, scale), classes=np.array(["ant", "bee", "cat"]),
                            columns=columns)


def assert_serves_as_predict(model: DBN) -> None:
    """The exported graph loads in ONNX Runtime and answers ROWS as the model does."""
    X = ROWS[:, :model.n_features_in_]
    session = ort.InferenceSession(to_onnx(model).SerializeToString(), providers=["CPUExecutionProvider"])
    inputs = [i.name for i in session.get_inputs()]
    columns = list(model.input_columns_)
    if inputs == ["features"]:
        feeds = {"features": X.astype(np.float32)}
    else:
        assert inputs == columns
        feeds = {name: X[:, [j]].astype(np.float32) for j, name in enumerate(columns)}
    assert [o.name for o in session.get_outputs()] == ["label", "probabilities"]  # as docs/serving.md says
    label, probabilities = session.run(None, feeds)
    assert np.abs(probabilities - model.predict_proba(X)).max() <= TOLERANCE
    assert list(label) == list(model.predict(X))


@pytest.mark.parametrize("name", GRAPH_NAMES)
@pytest.mark.parametrize("kind", ["min_max", "standard"])
def test_a_column_named_like_a_value_of_the_graph_is_served(name, kind):
    assert_serves_as_predict(with_columns(["x", name, "y"], kind))


def test_every_name_of_the_graph_at_once_is_served():
    assert_serves_as_predict(with_columns(GRAPH_NAMES[:4]))
    assert_serves_as_predict(with_columns(["label", "probabilities", "features", "rows"]))


def test_columns_named_like_the_outputs_are_read_from_one_input_of_all_features():
    """docs/serving.md: the outputs keep their names; a model with a column named like one of them
    takes its rows in the one input ``features``, in the model's order."""
    exported = to_onnx(with_columns(["x", "label", "y"]))
    assert [i.name for i in exported.graph.input] == ["features"]
    assert [o.name for o in exported.graph.output] == ["label", "probabilities"]
    assert not any(name in ("x", "y") for name in (*(n.output[0] for n in exported.graph.node),
                                                   *(c.name for c in exported.graph.initializer)))
    assert_serves_as_predict(with_columns(["x", "y", "probabilities"]))


def test_a_column_named_as_no_input_can_be_is_read_from_one_input_of_all_features():
    """A name UTF-8 cannot carry (a lone surrogate, which a pandas frame may hold) cannot name an input."""
    model = with_columns(["x", "\ud800", "y"])
    assert [i.name for i in to_onnx(model).graph.input] == ["features"]
    assert_serves_as_predict(model)


def test_the_graphs_own_names_never_take_an_inputs_place():
    """Columns starting with the prefix of the graph's own names push those names to another prefix."""
    exported = to_onnx(with_columns(["dbn/rows", "dbn/b0", "dbn1/W0"]))
    inputs = [i.name for i in exported.graph.input]
    assert inputs == ["dbn/rows", "dbn/b0", "dbn1/W0"]
    own = [*(c.name for c in exported.graph.initializer), *(o for n in exported.graph.node for o in n.output)]
    assert not set(own) & set(inputs) and len(set(own)) == len(own)


NAMES = st.one_of(st.sampled_from(GRAPH_NAMES), st.text(min_size=1, max_size=12),
                  st.text(alphabet=" \t\n\x00/.:é数🙂", min_size=1, max_size=4),
                  st.builds("dbn/{}".format, st.text(max_size=6)))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(columns=st.lists(NAMES, min_size=1, max_size=4, unique=True))
def test_any_column_names_are_served_as_predict_answers(columns):
    """Random names: every name of the graph, unicode, spaces, NULs, names of one space."""
    assert_serves_as_predict(with_columns(columns))


def test_an_onnx_or_onnx_runtime_error_at_export_is_a_known_error_naming_the_columns(tmp_path, monkeypatch,
                                                                                     capsys):
    import onnx

    model = with_columns(["odd column", "b", "c"])
    model.save(tmp_path / "m.npz")
    out = tmp_path / "m.onnx"

    def invalid(exported, *args, **kwargs):
        raise onnx.checker.ValidationError("'odd column' is not liked")

    with monkeypatch.context() as patch:
        patch.setattr(onnx.checker, "check_model", invalid)
        assert main(["export", str(tmp_path / "m.npz"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "dbn: error:" in err and "'odd column'" in err and "Traceback" not in err and not out.exists()

    def refused(*args, **kwargs):
        raise ort.capi.onnxruntime_pybind11_state.Fail("[ONNXRuntimeError] : 1 : FAIL : no")

    with monkeypatch.context() as patch:
        patch.setattr(ort, "InferenceSession", refused)
        assert main(["export", str(tmp_path / "m.npz"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "dbn: error:" in err and "ONNX Runtime" in err and "'odd column'" in err and not out.exists()
