"""What this device can do (matmul fp32/fp16/bf16, memory, host-device copy), as JSON.

python benchmarks/device.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.node.bench import run_benchmark


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    print(json.dumps(run_benchmark(quick=args.quick)))


if __name__ == "__main__":
    main()
