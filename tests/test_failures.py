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
