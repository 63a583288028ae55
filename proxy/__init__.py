"""The service: everything of llamaswap but the scheduler (`scheduling/`), which it reaches through the front door.

Its rooms, each importing only those below it (`tests/test_layers.py` holds the order): the commands
(`management/`), the routing of the model paths (`routing.py`), OpenAI's Files and Batch APIs (`batches/`), what
runs before the ASGI app (`server/`), the consumers of WebSockets (`websockets/`) and of HTTP model routes
(`http/`), the service's own views (`api/`), a config reload (`reload.py`), the composition root (`service.py`),
reaching the model servers and peers (`upstream/`), one model request whatever carries it (`serving/`), the model
server processes and the machine they run on (`model_processes/`), and the config reader (`config/`)."""
