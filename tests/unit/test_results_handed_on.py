"""What a step receives: checked where the step is written, with no database (the runs
themselves: tests/integration/workflows/test_results.py)."""

import pytest

from django_jobguard import InvalidArgumentsError
from django_jobguard.task import POSITIONAL
from tests.testapp import tasks, tasks_results


def test_receives_without_a_name_places_the_result_before_the_steps_own_arguments():
    step = tasks.add.s(10).receives()
    assert step.result_as == POSITIONAL
    fields = step.prepared()
    assert (fields["args"], fields["kwargs"]) == ([None, 10], {})


def test_receives_results_is_opt_in_and_may_sit_beside_the_summary():
    assert tasks_results.collect.s("x").results_as == ""
    step = tasks_results.collect.s("x").receives("progress").receives_results("results")
    assert (step.result_as, step.results_as) == ("progress", "results")
    fields = step.prepared()
    assert (fields["args"], fields["kwargs"]) == (["x"], {"progress": None, "results": None})
    positional = tasks_results.collect_first.s(label="y").receives_results()
    assert positional.prepared()["args"] == [None]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        # Both arguments of add(a, b=0) are given: no room for a first positional argument.
        (
            lambda: tasks.add.s(1, 2).receives(),
            r"tests\.testapp\.tasks\.add\(a: 'int', b: 'int' = 0\) -> 'int' cannot take a result",
        ),
        # a is given by name: the received value would fill it twice.
        (lambda: tasks.add.s(a=1).receives(), r"cannot take a result as its first positional argument"),
        (lambda: tasks_results.collect.s("x").receives_results("totals"), r"has no parameter 'totals'"),
        (lambda: tasks_results.collect.s("x", results=[]).receives_results("results"), r"'results' is given"),
        (
            lambda: tasks_results.collect.s("x").receives("results").receives_results("results"),
            r"'results' is given already; it cannot also receive the results",
        ),
        (
            lambda: tasks_results.collect_first.s().receives().receives_results(),
            r"its first positional argument receives a value already",
        ),
        (lambda: tasks_results.collect.s("x").receives_results(""), r"not ''"),
        (lambda: tasks_results.collect.s("x").receives_results(POSITIONAL), r"not '\*'"),
    ],
)
def test_a_step_that_cannot_take_what_it_would_receive_is_refused_where_it_is_written(make, message):
    with pytest.raises(InvalidArgumentsError, match=message):
        make()
