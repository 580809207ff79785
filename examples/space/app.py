"""Hugging Face Space entry point: the itune-hf demo page (the same page as `itune serve`).

Space variables (Settings -> Variables): `ITUNE_MODEL`, a full or adapter-only I-Tuning checkpoint on the Hub
(default: the `itune-tiny-random` preset, random weights, to try the page); `ITUNE_ADAPTERS`, more adapter-only
checkpoints of the same base to switch between, separated by spaces.
"""

import os

from itune_hf.app import load_service, serve

service = load_service(os.environ.get("ITUNE_MODEL", "itune-tiny-random"), os.environ.get("ITUNE_ADAPTERS", "").split())
serve(service, host=os.environ.get("GRADIO_SERVER_NAME", "0.0.0.0"), port=int(os.environ.get("PORT", "7860")))
