"""Payloads encrypted at rest (issue 62)."""
