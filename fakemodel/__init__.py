"""A stand-in for a model server, shipped as `llamaswap fakemodel` (or `python -m fakemodel`): the demo config,
the tests and the benchmarks run it as the upstream. Standard library only, and no part of the proxy: `server.py`
is the OpenAI-compatible server, `nvidia_smi.py` the `nvidia-smi` that reports the memory it claims."""
