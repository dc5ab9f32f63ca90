"""Helpers the tests share: fixtures of servers, namespaces and dead letters, not tests themselves."""
