"""The fp8 draft head's tuner: offline code that measures the overlay's kernels and writes
the table the overlay reads (``mods/dsv4-flash-overlays/dsv4_flash_overlays/fp8_configs.json``).

Why it lives here and not in the overlay: the overlay folder is copied to the Sparks and
holds only what a serving process runs; tuning runs once per GPU model, from a clone of this
repository (``python -m bench.kernels.fp8_tune``; the overlay README's fp8 section has the
docker command). Imports point one way: this package uses the overlay's runtime modules
(``dsv4_flash_overlays.fp8_head``), never the reverse. Modules:

* ``tune``: the operator command (also run by ``python -m bench.kernels.fp8_tune``);
* ``search``: the search space per M and the parallel compile step;
* ``timing``: CUDA-graph timing over rotated weight copies and the exactness check;
* ``evalset``: the synthetic accuracy set (argmax agreement with the bf16 head);
* ``reference``: exact float64 references, torch emulations of the kernels, error bounds;
* ``table``: writes ``fp8_configs.json``, recording commands without this machine's paths.
"""
