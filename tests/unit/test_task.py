import pytest

from django_jobguard import InvalidArgumentsError, task
from django_jobguard.exceptions import InvalidTaskError
from django_jobguard.registry import registry
from tests.testapp import tasks


def test_tasks_are_registered_under_their_dotted_path():
    assert tasks.add.name == "tests.testapp.tasks.add"
    assert registry.get("tests.testapp.tasks.add") is tasks.add


def test_unknown_task_lookup_names_the_task():
    with pytest.raises(LookupError, match=r"nope\.missing"):
        registry.get("nope.missing")


def test_lock_template_must_name_parameters():
    with pytest.raises(InvalidTaskError, match="'order'"):

        @task(lock="order:{order}", name="tests.bad_lock")
        def charge(order_id: int) -> None: ...


def test_takes_context_needs_a_first_positional_parameter():
    with pytest.raises(InvalidTaskError, match="first parameter"):

        @task(takes_context=True, name="tests.bad_context")
        def handler(*, order_id: int) -> None: ...


def test_nested_functions_need_an_explicit_name():
    with pytest.raises(InvalidTaskError, match="module level"):

        @task
        def inner() -> None: ...


@pytest.mark.parametrize("option", [{"priority": 101}, {"max_attempts": 0}, {"visibility_timeout": 0}])
def test_invalid_options_are_rejected(option):
    with pytest.raises(InvalidTaskError):
        task(name="tests.bad_option", **option)(lambda: None)


def test_bind_rejects_arguments_that_do_not_fit():
    with pytest.raises(InvalidArgumentsError, match=r"tests\.testapp\.tasks\.add"):
        tasks.add.bind([1, 2, 3], {})


def test_lock_key_is_formatted_from_bound_arguments():
    bound = tasks.locked_interval.bind(["alpha"], {})
    assert tasks.locked_interval.lock_key_for(bound) == "res:alpha"


def test_call_runs_the_handler_in_process():
    assert tasks.add.call(2, b=3) == 5


def test_using_returns_a_copy_with_overrides():
    copy = tasks.add.using(priority=10, queue_name="fast")
    assert (copy.priority, copy.queue_name) == (10, "fast")
    assert tasks.add.priority == 0


def test_a_bad_retry_option_names_the_task_option_not_a_setting():
    with pytest.raises(InvalidTaskError) as info:
        task(name="tests.bad_retry", retry={"maxx": 1})(lambda: None)
    message = str(info.value)
    assert "@task(retry=...): retry['maxx'] is not a known setting" in message
    assert "JOBGUARD" not in message


def test_tasks_are_not_exposed_to_the_api_unless_they_say_so():
    from tests.testapp import tasks

    assert tasks.add.api is False
    assert tasks.api_add.api is True
    assert tasks.api_add.using(priority=3).api is True


def test_api_true_opens_neither_the_queue_nor_a_higher_priority():
    assert (tasks.api_notify.api_queue_name, tasks.api_notify.api_max_priority) == (False, None)
    assert (tasks.api_add.api_queue_name, tasks.api_add.api_max_priority) == (True, 100)
    assert (tasks.api_report.api, tasks.api_report.api_queue_name, tasks.api_report.api_max_priority) == (
        True,
        False,
        10,
    )


@pytest.mark.parametrize(
    ("api", "message"),
    [
        ({"queue": True}, "api has no option 'queue'; options: queue_name, max_priority."),
        ({"queue_name": "yes"}, "api['queue_name'] must be True or False, not 'yes'."),
        ({"max_priority": 101}, "api['max_priority'] must be an integer from the task's priority (5) to 100"),
        ({"max_priority": 4}, "api['max_priority'] must be an integer from the task's priority (5) to 100"),
        ({"max_priority": True}, "api['max_priority'] must be an integer"),
        ("yes", "api must be True, False or a dict"),
    ],
)
def test_bad_api_options_are_refused_at_declaration(api, message):
    with pytest.raises(InvalidTaskError) as refused:
        task(name="tests.bad_api", priority=5, api=api)(lambda: None)
    assert str(refused.value).startswith(message)


@pytest.mark.parametrize("value", ["x" * 238, "a:fencing"])
def test_a_lock_key_the_lock_cannot_hold_is_refused(value):
    bound = tasks.locked_interval.bind([value], {})
    with pytest.raises(InvalidArgumentsError, match=r"lock template 'res:\{resource\}' gave a key"):
        tasks.locked_interval.lock_key_for(bound)
    # 255 characters with the prefix "jobguard:lock:" and "res:" fit.
    assert (
        tasks.locked_interval.lock_key_for(tasks.locked_interval.bind(["x" * 237], {})) == "res:" + "x" * 237
    )


def test_an_empty_lock_key_is_refused_rather_than_run_unlocked():
    bare = task(name="tests.bare_lock", lock="{name}")(lambda name: None)
    try:
        with pytest.raises(InvalidArgumentsError, match="gave a key of 0 characters"):
            bare.lock_key_for(bare.bind([""], {}))
    finally:
        registry.unregister(bare.name)
