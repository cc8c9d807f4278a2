"""RPC method names and error codes of the expert protocol, shared by server and client.

moe.forward   meta {uid, keep?}, tensors [inputs]
              -> meta {version, sha256, handle?}, tensors [outputs]
moe.backward  meta {uid}, tensors [inputs, grad_outputs]
              -> meta {version, sha256}, tensors [grad_inputs]
moe.backward  meta {uid, handle}, tensors [grad_outputs]: the same, through the graph that
              the forward pass with keep=True left on the server (error graph_gone if not)
moe.info      meta {uid} -> meta {uid, spec, version, sha256, max_batch, load}
"""

from typing import Final

FORWARD: Final = "moe.forward"
BACKWARD: Final = "moe.backward"
INFO: Final = "moe.info"
#: Error code of a backward request whose kept forward graph is gone.
GRAPH_GONE: Final = "graph_gone"
