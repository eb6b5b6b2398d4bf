"""Stand-in for lerobot (openpi's data loader imports it at import time; fake data never builds it).

The real lerobot is pinned by openpi to a git commit that cannot be fetched on the GPU machines. Only
``lerobot.common.datasets.lerobot_dataset`` is imported by openpi's ``training/data_loader.py``; its two
classes raise if anything tries to build a real dataset, so a config that silently fell back to real
data fails loudly instead of measuring something else.
"""
