"""Addresses both processes agree on."""

LOOPBACK = "127.0.0.1"
"""The only address a lockstep server binds unless the config says otherwise (the network rule of the project)."""
