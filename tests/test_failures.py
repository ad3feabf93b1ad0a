"""The one line that says why a stage stopped. The real Ray Data wrapping is checked where a teacher's outage stops
a stage (tests/stages/test_teacher_http.py); here, its text shape alone, and the plain cases."""

from flywheel.failures import summary


class RayTaskError(Exception):  # a stand-in with the name and the text shape of Ray's wrapper, nothing else
    pass


def test_a_plain_error_is_its_type_and_first_line():
    assert summary(ValueError("bad value\nmore detail")) == "ValueError: bad value"
    assert summary(KeyError()) == "KeyError"
    assert summary(RuntimeError("x" * 1000)).endswith("...") and len(summary(RuntimeError("x" * 1000))) == 400


def test_a_wrapped_error_is_the_last_exception_line_of_ours_in_its_text():
    text = ("ray::_CoreActor.submit() (pid=1)\nTraceback (most recent call last):\n  File \"a.py\", line 1\n"
            "flywheel.engines.http.EndpointUnavailable: http://x/v1/chat/completions: 3 of 8 requests failed\n"
            "ray.exceptions.UserCodeException: UDF failed to process a data block.\n"
            "To change retry attempts, configure `ray.data.DataContext.get_current()`")
    assert summary(RayTaskError(text)) == ("EndpointUnavailable: http://x/v1/chat/completions: 3 of 8 requests "
                                           "failed")
    assert summary(RayTaskError("no exception line in here")) == "RayTaskError: no exception line in here"


def test_any_qualified_exception_name_counts_and_the_last_one_wins():
    # The shape of a refusal raised in a Ray Data actor (2026-12-01): the refusal chained to a RuntimeError; its
    # name ends in none of the builtin endings, and before the fix the line said "RuntimeError: no running event loop"
    text = ("ray::MapWorker(MapBatches(_CoreActor)).submit() (pid=5796)\nRuntimeError: no running event loop\n\n"
            "During handling of the above exception, another exception occurred:\n\n"
            "Traceback (most recent call last):\n  File \"http.py\", line 168, in agenerate\n"
            "flywheel.engines.http.EndpointRefused: http://x/v1/chat/completions: 3 of 3 requests refused (first: "
            "HTTP 404: not found)\n\nThe above exception was the direct cause of the following exception:\n\n"
            "ray.exceptions.UserCodeException: UDF failed to process a data block.")
    assert summary(RayTaskError(text)) == ("EndpointRefused: http://x/v1/chat/completions: 3 of 3 requests refused "
                                           "(first: HTTP 404: not found)")
    waited = "Traceback:\nflywheel.raycluster.ActorsDidNotStart: stage x: not up within 4 s\nNote: see the log"
    assert summary(RayTaskError(waited)) == "ActorsDidNotStart: stage x: not up within 4 s"  # "Note:" is no exception
