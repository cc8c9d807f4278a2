"""``moehome demo``: the scenario (what runs, with churn, attackers and slow links), the
supervisor of its processes, and the summary."""

from core.demo.options import DemoOptions, wire_codecs
from core.demo.scenario import demo_manifest, run_demo
from core.demo.summary import print_summary

__all__ = ["DemoOptions", "demo_manifest", "print_summary", "run_demo", "wire_codecs"]
