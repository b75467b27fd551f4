"""Research code apart from the product: experiments that use fsframework, never the reverse.

- `copy_drill.py`: how many steps until a model copies from its context (repeated random
  passages; `copying.py` holds its copy losses and onset, `routing.py` FreeSolo's routing
  diagnostics: routing recall, routing ablations, the readout's weight on the copied token).
- `replicate_extrapolation.py`: the tiny-scale, CPU replication of length extrapolation
  (configs in `yamls/`).

Run the scripts from the repository root, e.g. `python experiments/copy_drill.py --help`;
they put the root on `sys.path`, so `experiments` and `fsframework` import from the
checkout. The library (`fsframework`) must not import this package.
"""
