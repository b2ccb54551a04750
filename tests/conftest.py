import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
