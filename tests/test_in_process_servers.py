"""The suite's in-process servers leave the pytest process's logging alone.

uvicorn's default settings run `logging.config.dictConfig`, which closes every logging handler in the
process. absl's handler (imported with tensorboard and OpenVINO's tools) closes the stream it was made
with unless that is the current `sys.stderr`: a server started while `capsys` had swapped `sys.stderr`
closed pytest's own capture file, and every later test of that xdist worker failed with
"I/O operation on closed file" (seen as ~700 errors after tests/test_unknown.py's browser test).
"""

from __future__ import annotations

import logging

import httpx
from serve_helpers import uvicorn_thread

from inceptionlab.serve.app import create_app
from inceptionlab.serve.service import RequestSettings


class RecordingHandler(logging.Handler):
    """A handler that remembers being closed (as absl's closes its stream then)."""

    def __init__(self):
        super().__init__()
        self.was_closed = False

    def emit(self, record):
        pass

    def close(self):
        self.was_closed = True
        super().close()


def test_an_in_process_server_closes_no_logging_handler_of_the_process():
    handler = RecordingHandler()
    with uvicorn_thread(create_app([], RequestSettings())) as base:
        assert httpx.get(base + "/v2/health/live", timeout=30).status_code == 200
    assert not handler.was_closed
    handler.close()
