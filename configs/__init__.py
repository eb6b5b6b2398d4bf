"""The built-in example configs (``*.yaml``) and the queue files, shipped inside the package as ``jaxfit.configs``."""
