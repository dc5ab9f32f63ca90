"""manage.py jobguard_encryption_key: a fresh key the settings accept, and how to install it."""

from __future__ import annotations

import datetime
import re
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from django_jobguard.conf.encryption import parse_key


def _run(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("jobguard_encryption_key", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_prints_a_32_byte_key_alone_on_stdout_and_the_advice_on_stderr():
    out, err = _run("--id", "payments-2025.1")
    line = out.strip()
    assert "\n" not in line
    key_id, raw = parse_key(line, "the command's output")
    assert key_id == "payments-2025.1"
    assert len(raw) == 32
    assert "JOBGUARD_ENCRYPTION_KEYS" in err and "jobguard_reencrypt" in err
    assert line.partition(":")[2] not in err  # the secret is never in the advice


def test_each_key_is_new_and_the_default_id_is_dated():
    first, second = _run()[0].strip(), _run()[0].strip()
    assert first.partition(":")[2] != second.partition(":")[2]
    today = datetime.datetime.now(tz=datetime.UTC).strftime("%Y%m%d")
    assert re.fullmatch(rf"k{today}-[0-9a-f]{{4}}", parse_key(first, "output")[0])


@pytest.mark.parametrize("bad", ["", "has space", "x" * 33, "a:b", "a,b"])
def test_a_bad_id_is_refused_and_named(bad):
    with pytest.raises(CommandError, match="--id"):
        _run("--id", bad)
