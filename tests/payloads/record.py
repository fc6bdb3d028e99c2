"""A trivial training payload for Slurm tests: records what the task received, then exits."""

import json
import os
import socket
import sys
from pathlib import Path

out = Path(os.environ["FRENZY_JOB_DIR"]) / f"rank-{os.environ['RANK']}.json"
out.write_text(
    json.dumps(
        {
            "argv": sys.argv[1:],
            "rank": int(os.environ["RANK"]),
            "world_size": int(os.environ["WORLD_SIZE"]),
            "local_rank": int(os.environ["LOCAL_RANK"]),
            "master": f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
            "gpu": os.environ.get("FRENZY_GPU"),
            "host": socket.gethostname(),
            "env": {k: v for k, v in os.environ.items() if k.startswith("HOSTILE")},
            "ds_config_exists": Path(os.environ["FRENZY_DS_CONFIG"]).exists(),
        }
    )
)
