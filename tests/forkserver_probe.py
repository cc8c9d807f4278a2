"""Run by tests/processes/test_forkserver.py in a process the fork server forked: it says
what the child sees (arguments, folder, environment, session, stdin, torch's threads),
then waits for a signal or exits as its arguments ask."""

import json
import os
import signal
import sys

what = {
    "argv": sys.argv[1:],
    "cwd": os.getcwd(),
    "probe_value": os.environ.get("PROBE_VALUE"),
    "own_session": os.getsid(0) == os.getpid(),
    "stdin": sys.stdin.read(),
    "network_namespace": os.readlink("/proc/self/ns/net"),
    "torch_threads": sys.modules["torch"].get_num_threads() if "torch" in sys.modules else None,
    "torch_seed": sys.modules["torch"].initial_seed() if "torch" in sys.modules else None,
}
print(json.dumps(what), flush=True)
print("to the log", file=sys.stderr, flush=True)
if sys.argv[1] == "sleep":  # until a signal ends it (the tests send one)
    signal.pause()
sys.exit(int(sys.argv[2]))
