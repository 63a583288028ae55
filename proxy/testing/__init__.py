"""A stand-in for a model server, for the tests, the demo config and the benchmarks; not part of serving."""
