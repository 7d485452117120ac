"""Watching a live run from any shell: samples from every host of it (`clusterrun top`).

watch.py keeps one connection and one sampler (remote/tools/sampler.py) per host across refreshes;
frame.py holds one refresh as typed values, the JSON shape `top --json` prints and the flags
(slow or silent ranks); view.py draws a frame with rich.
"""
