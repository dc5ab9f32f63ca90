"""Helpers of the REST API tests: clients logged in as users with given jobguard permissions."""

from __future__ import annotations

from django.contrib.auth.models import User
from rest_framework.test import APIClient

from tests.support.factories import make_user

BASE = "/jobguard/api/"


def client_for(user: User | None) -> APIClient:
    client = APIClient()
    if user is not None:
        client.force_authenticate(user)
    return client


def as_user(name: str, *codenames: str) -> tuple[APIClient, User]:
    user = make_user(name, *codenames)
    return client_for(user), user
