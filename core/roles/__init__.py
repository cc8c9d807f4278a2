"""Runners that assemble a role from the libraries below: a bootstrap peer (peer.py), a
standalone expert server (expert_server.py), the owner's publishing and serving
(owner.py), an aggregator (aggregator.py). The volunteer's node (core/node) and the
trainer (core/trainer) are roles with packages of their own. Called by the CLI."""
