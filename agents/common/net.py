"""Addresses both processes agree on."""

LOOPBACK = "127.0.0.1"
"""The only address a lockstep server binds unless the config says otherwise (the network rule of the project)."""

DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""No gRPC message between controller and agents is larger by default (``controller.max_message_bytes``)."""
