"""The engine in its container: the image and its shipping to rank 1, the boot log's phases
and the boot watch that follows them, and the overlays mounted into it."""
