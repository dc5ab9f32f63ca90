import pytest
from django.core.management import call_command


@pytest.mark.django_db
def test_models_and_migrations_agree():
    call_command("makemigrations", "jobguard", "--check", "--dry-run", verbosity=0)
