"""The node's local control API: what the tray and scripts use. This package stays light
(no torch, trio or libp2p; checked by import-linter) so the tray can import it."""

from core.control.client import ControlClient, ControlError, NodeNotRunning, find_node

__all__ = ["ControlClient", "ControlError", "NodeNotRunning", "find_node"]
