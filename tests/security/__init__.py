"""Regression tests of the security review (issue 17) and the TLS / fuzzing work (issue 13); docs/security.md."""
