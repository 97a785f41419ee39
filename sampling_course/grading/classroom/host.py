"""The double host: a third process, neither the grader's nor the submission's, holding the doubles
whose record decides a verdict.

A test that judges how a submission's loop calls its model (how often, with what, with how much
cached) reads a record. Kept in the submission's process, the submission could edit it; kept in
the grader, the submission would hold an object of the grader's. So it is kept here: this process
runs only the course's runtime, in the same sandbox as a submission (``jail.py``, with no copy of
its own), and talks to two peers:

* the grader (trusted: it asks for doubles to be made and reads their records, as data);
* the submission (trusted with nothing: it calls the doubles made for it, and the policy of
  ``policy.py`` answers it, as the grader's objects used to).

A double wraps a handle to an object of the submission's process (the model made beside its
code); the grader names that object by a description the submission's process gave it
(``bridge.Endpoint.made_apart``). This process calls that object only while the submission is
calling a double here: the submission reads this connection only while it waits for an answer.
Neither connection carries the random state: each process keeps its own.
"""

from __future__ import annotations

import socket
import threading
from typing import Any

from sampling_course.beside import build
from sampling_course.grading.classroom.bridge import Endpoint

__all__ = ["SUBMISSION_BYTES", "made_apart", "made_for_submission", "serve"]

SUBMISSION_BYTES = 1 << 30  # what the submission may send this process in all
_PEERS: dict[str, Endpoint] = {}  # "submission": this process's connection to the submission's


def made_apart(endpoint: Endpoint, start_host: Any, ref: int, name: str, args: tuple, kwargs: dict[str, Any]) -> Any:
    """The grader's side (``endpoint``: its connection to the submission): the runtime's ``name`` made in the
    double host (``start_host()``: the grader's connection to it) around the submission's object ``ref``. A
    handle to it there; the submission's code, handed it, gets a handle to the host's object."""
    host = start_host()
    spec = endpoint.request("lend", ref)  # the submission's process hands its object to its connection to the host
    made, for_submission = host.request("import", None, name=__name__).made_for_submission(name, spec, *args, **kwargs)
    endpoint.made_for_peer[id(made)] = (made, for_submission)
    return made


def made_for_submission(name: str, spec: dict[str, Any], /, *args: Any, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
    """The runtime's ``name`` called with the submission's object that ``spec`` describes (then ``args``):
    the object made (a handle, for the grader) and its description for the submission's process."""
    submission = _PEERS["submission"]
    made = build(None, name, submission.adopt(spec), *args, **kwargs)
    return made, submission.handle_spec(made)


def serve(grader: socket.socket, submission: socket.socket) -> None:
    """Answer the submission (in a thread) and the grader (here) until the grader hangs up."""
    peer = Endpoint(submission, peer_trusted=False, owns_modules=False, random_state=False)
    peer.budget = SUBMISSION_BYTES
    _PEERS["submission"] = peer
    thread = threading.Thread(target=peer.serve_forever, daemon=True)
    thread.start()
    Endpoint(grader, peer_trusted=True, owns_modules=False, random_state=False).serve_forever()
    try:  # the grader hung up: so does this process, to the submission (its thread reads the end and returns)
        submission.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    thread.join(timeout=10)
