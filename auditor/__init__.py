"""Fact collection, expected-vs-found checks, risk ranking and reports."""
