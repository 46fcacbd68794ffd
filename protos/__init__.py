"""Generated gRPC code of the lockstep protocol (see protos/lockstep/v1/*.proto)."""
