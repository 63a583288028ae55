"""The engine: the single consumer that owns the GPU.

Consumers call `submit()` and await a lease; the pure scheduling core decides who goes next and the
engine carries out what it asks for (grant, start or stop a model, reject). Every core call happens
on the event loop, one at a time, so the core needs no locks. The engine knows nothing of HTTP: model
processes are reached through a `fleet` object and rows through a recorder.

`SchedulerRuntime` (`engine`) is the request path, with taking over from another worker, the reads the front
doors' questions answer from, and the shutdown. It owns parts with their own state: the requests it holds,
waiting or granted (`HeldRequests`, `held`), the model starts and stops under way (`ModelProcesses`,
`processes`), the queue's forecast (`Forecasting`, `forecasting`), the requests relayed to a peer with their
rows (`RelayedRows`, `relayed`) and the model leases (`ModelLeases`, `model_leases`); and the operators' ways
in (`OperatorActions`, `operators`: cancel, cut, re-rank, retune, reconfigure, calls from other threads),
which change the engine only through its request path.
Only the composition root (`proxy/service.py`) and the worker side build or name it.
"""

from .engine import MAX_WAIT_RETRY_AFTER_S, HandedOver, SchedulerRuntime
from .processes import Fleet

__all__ = ["MAX_WAIT_RETRY_AFTER_S", "Fleet", "HandedOver", "SchedulerRuntime"]
