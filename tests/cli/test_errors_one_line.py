"""An input error's field path stays readable when the path is long (a deep temporary file)."""

from wansim.errors import MAX_PATH_CHARS, WansimInputError


def test_a_long_path_keeps_the_file_start_and_the_field_at_its_end():
    path = "/tmp/" + "d" * 300 + "/bad.yaml: workloads.code.hybrid_confident_fraction"
    text = str(WansimInputError(path, "must be <= 1", 1.5))
    shown = text.split(": must be")[0]
    assert len(shown) == MAX_PATH_CHARS
    assert shown.startswith("/tmp/ddd") and "..." in shown
    assert shown.endswith("bad.yaml: workloads.code.hybrid_confident_fraction")
    assert text.endswith(", got 1.5") and "\n" not in text


def test_a_short_path_is_shown_whole():
    assert str(WansimInputError("a.b", "must be > 0", -5)) == "a.b: must be > 0, got -5"


def test_an_input_error_crosses_a_process_pool_whole():
    """A worker's input error reaches the parent as itself (pickled as its three parts): the
    agreement hunt's pool broke on one ('missing 1 required positional argument: problem')."""
    import pickle

    from wansim.errors import ScenarioError
    from wansim.sweep.spec import SweepError

    for err in (
        ScenarioError("a.b", "must be > 0", -5),
        WansimInputError("x", "bad"),
        SweepError("grid", "no", [1]),
    ):
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err) and str(back) == str(err)
        assert (back.path, back.problem) == (err.path, err.problem)
