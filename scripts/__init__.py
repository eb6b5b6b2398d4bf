"""The example training script, shipped inside the package as ``jaxfit.scripts``: ``jaxfit examples --copy DIR`` writes it out."""
