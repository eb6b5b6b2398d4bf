"""Configs of the bundled example models, and loading them from the YAML examples.

Example configs are YAML files in the repository's top-level ``configs/`` directory, installed as
the package ``jaxfit.configs``. A file ``<name>.yaml`` is the example ``<name>`` when its top-level
mapping has a ``family:`` key (``gpt``, ``vit`` or ``mlp``); the other keys are a one-line
``description:`` and the fields of that family's config dataclass. Other YAML files in the
directory (without ``family:``) are not examples and are skipped.

Every bad input (unknown example or key, unparsable value, impossible shape, malformed file) raises
:class:`jaxfit.errors.ConfigError` with a one-line message that says what is wrong and how to fix it.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import math
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import yaml

from jaxfit.errors import ConfigError

EXAMPLES_PACKAGE = "jaxfit.configs"
"""The package whose ``*.yaml`` files are the bundled examples."""

DEFAULT_EXAMPLE = "gpt-tiny"
"""The example used when none is named."""

DTYPES: tuple[str, ...] = ("float32", "bfloat16")
REMAT_POLICY_NAMES = ("nothing", "dots", "dots_no_batch")
"""What a rematerialised block may save (see ``jaxfit.examples.models.REMAT_POLICIES``)."""
"""The allowed values of every config's ``dtype`` field."""

_TRUE = frozenset({"true", "1", "yes"})
_FALSE = frozenset({"false", "0", "no"})
_NON_FIELD_KEYS = frozenset({"family", "description"})


def _one_line(text: str) -> str:
    """Collapse ``text`` to a single line (error messages must be one line)."""
    return " ".join(str(text).split())


def _has_type(value: Any, expected: type) -> bool:
    """Whether ``value`` is a valid value of a field annotated ``expected`` (bools are not ints)."""
    if expected is bool:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if expected is float:
        return isinstance(value, (int, float))
    return isinstance(value, expected)


class _ConfigChecks:
    """Validation shared by the config dataclasses of every family (a mixin without fields).

    Every family has the fields ``dtype``, ``learning_rate`` and ``weight_decay``; integer fields
    are sizes and must be positive.
    """

    family: ClassVar[str] = ""
    dtype: str
    learning_rate: float
    weight_decay: float

    def __post_init__(self) -> None:
        """Check the types and values of every field (raises ``ConfigError``)."""
        hints = typing.get_type_hints(type(self))
        for field in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, field.name)
            expected = hints[field.name]
            if not _has_type(value, expected):
                raise ConfigError(
                    f"{self.family} config: {field.name}={value!r} is not of type "
                    f"{expected.__name__}; give {field.name} a value of that type"
                )
            if expected is int and value <= 0:
                raise ConfigError(
                    f"{self.family} config: {field.name}={value} must be a positive integer; "
                    f"set {field.name} to 1 or more"
                )
        if self.dtype not in DTYPES:
            raise ConfigError(
                f"{self.family} config: dtype={self.dtype!r} is not supported; use one of: {', '.join(DTYPES)}"
            )
        policy = getattr(self, "remat_policy", None)
        if policy is not None and policy not in REMAT_POLICY_NAMES:
            raise ConfigError(
                f"{self.family} config: remat_policy={policy!r} is not one of: {', '.join(REMAT_POLICY_NAMES)}"
            )
        if not (math.isfinite(self.learning_rate) and self.learning_rate > 0):
            raise ConfigError(
                f"{self.family} config: learning_rate={self.learning_rate} must be a positive "
                "number; e.g. learning_rate=3e-4"
            )
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ConfigError(
                f"{self.family} config: weight_decay={self.weight_decay} must be zero or more; e.g. weight_decay=0.01"
            )
        self._check()

    def _check(self) -> None:
        """Family-specific checks, run after the shared ones."""

    def _require_divisible(self, name: str, divisor_name: str) -> None:
        """Raise ``ConfigError`` unless field ``name`` is a multiple of field ``divisor_name``."""
        value, divisor = getattr(self, name), getattr(self, divisor_name)
        if value % divisor:
            raise ConfigError(
                f"{self.family} config: {name}={value} is not divisible by "
                f"{divisor_name}={divisor}; pick {name} a multiple of {divisor_name} "
                f"(e.g. {name}={max(divisor, value - value % divisor)})"
            )


@dataclasses.dataclass(frozen=True)
class GPTConfig(_ConfigChecks):
    """A GPT-style causal decoder language model.

    Attributes:
      d_model: Width of the residual stream.
      n_layers: Number of transformer blocks.
      n_heads: Attention heads per block (must divide ``d_model``).
      seq_len: Context length (tokens per sample).
      vocab_size: Vocabulary size (embedding rows and output logits).
      remat: Rematerialise each block in the backward pass (``jax.checkpoint``): less activation
        memory, more compute.
      remat_policy: What a rematerialised block saves: ``nothing`` (recompute it all),
        ``dots`` (the outputs of matrix products) or ``dots_no_batch`` (those without a batch
        dimension: the weights' products).
      dtype: ``"float32"`` or ``"bfloat16"``: the dtype of the parameters, the AdamW state and
        the compute (the loss is always computed in float32).
      learning_rate: AdamW learning rate.
      weight_decay: AdamW decoupled weight decay (applied to matrices only).
      grad_accum_steps: Micro-batches each batch is split into, gradients summed before the one
        update (the batch stays the same, the activations shrink).
    """

    family: ClassVar[str] = "gpt"

    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    seq_len: int = 256
    vocab_size: int = 8192
    remat: bool = False
    remat_policy: str = "nothing"
    dtype: str = "float32"
    learning_rate: float = 3e-4
    weight_decay: float = 0.01
    grad_accum_steps: int = 1

    def _check(self) -> None:
        self._require_divisible("d_model", "n_heads")


@dataclasses.dataclass(frozen=True)
class ViTConfig(_ConfigChecks):
    """A vision transformer classifier.

    Attributes:
      image_size: Height and width of the (square) input images, in pixels.
      patch_size: Height and width of a patch (must divide ``image_size``).
      channels: Input channels.
      d_model: Width of the residual stream.
      n_layers: Number of transformer blocks.
      n_heads: Attention heads per block (must divide ``d_model``).
      num_classes: Output classes.
      remat: Rematerialise each block in the backward pass.
      remat_policy: What a rematerialised block saves (``nothing``, ``dots``, ``dots_no_batch``).
      dtype: ``"float32"`` or ``"bfloat16"``: the dtype of the parameters, the AdamW state and
        the compute (the loss is always computed in float32).
      learning_rate: AdamW learning rate.
      weight_decay: AdamW decoupled weight decay (applied to matrices only).
      grad_accum_steps: Micro-batches each batch is split into, gradients summed before the one
        update (the batch stays the same, the activations shrink).
    """

    family: ClassVar[str] = "vit"

    image_size: int = 224
    patch_size: int = 16
    channels: int = 3
    d_model: int = 384
    n_layers: int = 12
    n_heads: int = 6
    num_classes: int = 1000
    remat: bool = False
    remat_policy: str = "nothing"
    dtype: str = "float32"
    learning_rate: float = 3e-4
    weight_decay: float = 0.01
    grad_accum_steps: int = 1

    def _check(self) -> None:
        self._require_divisible("d_model", "n_heads")
        self._require_divisible("image_size", "patch_size")


@dataclasses.dataclass(frozen=True)
class MLPConfig(_ConfigChecks):
    """An MLP classifier on flat inputs.

    Attributes:
      input_dim: Features per input sample.
      hidden_dim: Width of every hidden layer.
      n_layers: Number of hidden layers.
      num_classes: Output classes.
      dtype: ``"float32"`` or ``"bfloat16"``: the dtype of the parameters, the AdamW state and
        the compute (the loss is always computed in float32).
      learning_rate: AdamW learning rate.
      weight_decay: AdamW decoupled weight decay (applied to matrices only).
      grad_accum_steps: Micro-batches each batch is split into, gradients summed before the one
        update (the batch stays the same, the activations shrink).
    """

    family: ClassVar[str] = "mlp"

    input_dim: int = 3072
    hidden_dim: int = 4096
    n_layers: int = 4
    num_classes: int = 1000
    dtype: str = "float32"
    learning_rate: float = 3e-4
    weight_decay: float = 0.01
    grad_accum_steps: int = 1


ModelConfig = GPTConfig | ViTConfig | MLPConfig
"""Any family's config."""

FAMILIES: dict[str, type[GPTConfig] | type[ViTConfig] | type[MLPConfig]] = {
    cls.family: cls for cls in (GPTConfig, ViTConfig, MLPConfig)
}
"""Config class of each family name."""


def config_keys(cls: type[ModelConfig]) -> list[str]:
    """The field names of a config class, in declaration order."""
    return [f.name for f in dataclasses.fields(cls)]


def _coerce(family: str, key: str, value: Any, expected: type) -> Any:
    """Convert a YAML or command-line value to the field's type, or raise ``ConfigError``."""
    if value is None:
        raise ConfigError(f"{family} config: {key} has no value; give it a {expected.__name__}")
    if expected is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise ConfigError(f"{family} config: {key}={value!r} is not a boolean; use true/false, yes/no or 1/0")
    if expected is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        try:
            return int(str(value).strip(), 10)
        except ValueError:
            pass
        raise ConfigError(f"{family} config: {key}={value!r} is not an integer; give a whole number, e.g. {key}=256")
    if expected is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        try:
            result = float(str(value).strip())
        except ValueError:
            result = math.nan
        if math.isfinite(result):
            return result
        raise ConfigError(f"{family} config: {key}={value!r} is not a number; give a finite number, e.g. {key}=3e-4")
    if expected is str:
        if isinstance(value, (bool, int, float, str)):
            return str(value).strip()
        raise ConfigError(f"{family} config: {key}={value!r} is not a string; give a plain word")
    raise TypeError(f"unsupported config field type {expected!r} for {key}")  # programming error


def make_config(
    family: str,
    values: Mapping[str, Any] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> ModelConfig:
    """Build and validate a family's config from raw values and overrides.

    Args:
      family: ``"gpt"``, ``"vit"`` or ``"mlp"``.
      values: Field values (e.g. from YAML); missing fields take their defaults.
      overrides: Field values that replace ``values`` (strings from ``--set key=value`` are
        parsed as the field's type).

    Returns:
      The validated config.

    Raises:
      ConfigError: An unknown family or key, a value of the wrong type, or an impossible config.
    """
    cls = FAMILIES.get(str(family).strip().lower()) if isinstance(family, str) else None
    if cls is None:
        raise ConfigError(f"unknown model family {family!r}; use one of: {', '.join(sorted(FAMILIES))}")
    hints = typing.get_type_hints(cls)
    keys = config_keys(cls)
    kwargs: dict[str, Any] = {}
    for source in (values or {}, overrides or {}):
        for key, value in source.items():
            if key not in hints or key not in keys:
                raise ConfigError(f"unknown {cls.family} config key {key!r}; valid keys: {', '.join(keys)}")
            kwargs[key] = _coerce(cls.family, key, value, hints[key])
    return cls(**kwargs)


def parse_overrides(items: Iterable[str]) -> dict[str, str]:
    """Parse command-line ``key=value`` strings (as given to ``--set``) into a mapping.

    Raises:
      ConfigError: An item without ``=`` or with an empty key.
    """
    result: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r} must look like KEY=VALUE, e.g. --set n_layers=6")
        result[key.strip()] = value.strip()
    return result


def _example_files() -> dict[str, Any]:
    """``name -> resource`` of every ``<name>.yaml`` in the examples package (examples or not): the
    installed ``jaxfit.configs``, or the checkout's ``configs/`` when jaxfit runs from its source
    tree without being installed (``PYTHONPATH=.``, as on a machine that only has the checkout)."""
    try:
        root: Any = importlib.resources.files(EXAMPLES_PACKAGE)
    except ModuleNotFoundError:
        root = Path(__file__).resolve().parents[2] / "configs"
        if not root.is_dir():
            raise ConfigError(
                f"jaxfit's example configs are missing: no {EXAMPLES_PACKAGE} package and no {root}; "
                "reinstall jaxfit (pip install jaxfit)"
            ) from None
    return {
        entry.name[: -len(".yaml")]: entry
        for entry in root.iterdir()
        if entry.name.endswith(".yaml") and entry.is_file()
    }


def _parse_yaml(text: str, source: str) -> Any:
    """Parse YAML text, turning syntax errors into a one-line ``ConfigError``."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(err, "problem", None) or type(err).__name__
        raise ConfigError(f"{source}: malformed YAML{where}: {_one_line(problem)}; fix the syntax") from None


def _is_example(data: Any) -> bool:
    return isinstance(data, dict) and "family" in data


def list_examples() -> list[str]:
    """Names of the bundled example configs, sorted (unreadable or non-example YAML is skipped)."""
    names = []
    for name, entry in _example_files().items():
        try:
            data = yaml.safe_load(entry.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue
        if _is_example(data):
            names.append(name)
    return sorted(names)


def _read_example(name: str) -> tuple[str, str]:
    """``(source, text)`` of the example ``name``, or of the YAML file at path ``name``."""
    if name.endswith((".yaml", ".yml")) or "/" in name or "\\" in name:
        path = Path(name).expanduser()
        try:
            return str(path), path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise ConfigError(
                f"cannot read config file {name!r} ({_one_line(getattr(err, 'strerror', None) or str(err))}); check the path"
            ) from None
    entry = _example_files().get(name)
    if entry is None:
        available = ", ".join(list_examples()) or "none installed"
        raise ConfigError(f"unknown example {name!r}; available examples: {available}")
    return f"example {name!r}", entry.read_text(encoding="utf-8")


def _read_example_data(name: str) -> tuple[str, dict[str, Any]]:
    """``(source, mapping)`` of a valid example file (raises ``ConfigError`` otherwise)."""
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"example name {name!r} is empty; use one of: {', '.join(list_examples())}")
    source, text = _read_example(name.strip())
    data = _parse_yaml(text, source)
    if not isinstance(data, dict):
        raise ConfigError(
            f"{source}: malformed config: expected a mapping of key: value lines, got "
            f"{type(data).__name__}; write e.g. 'family: gpt'"
        )
    if "family" not in data:
        raise ConfigError(
            f"{source}: no 'family' key, so it is not an example config; add 'family: {'|'.join(sorted(FAMILIES))}'"
        )
    return source, data


def example_description(name: str) -> str:
    """The one-line ``description:`` of an example (or of a YAML config file path); may be empty."""
    _, data = _read_example_data(name)
    description = data.get("description")
    return _one_line(description) if description is not None else ""


def load_config(name: str, overrides: Mapping[str, Any] | None = None) -> ModelConfig:
    """Load an example config and apply command-line overrides.

    Args:
      name: An example name (see :func:`list_examples`), or the path of a YAML file in the same
        format (any name ending in ``.yaml``/``.yml`` or containing a path separator).
      overrides: ``key -> value`` replacing the file's values; string values (from
        ``--set key=value``) are parsed as the field's type.

    Returns:
      The family's config dataclass (``GPTConfig``, ``ViTConfig`` or ``MLPConfig``).

    Raises:
      ConfigError: With a one-line message, for an unknown example or key, a value that does not
        parse, a non-positive size, an indivisible shape, malformed YAML or a file without
        ``family``.
    """
    source, data = _read_example_data(name)
    family = data["family"]
    if not isinstance(family, str) or family.strip().lower() not in FAMILIES:
        raise ConfigError(f"{source}: unknown family {family!r}; use one of: {', '.join(sorted(FAMILIES))}")
    values = {k: v for k, v in data.items() if k not in _NON_FIELD_KEYS}
    for key in data:
        if not isinstance(key, str):
            raise ConfigError(f"{source}: config key {key!r} is not a name; use field names")
    try:
        return make_config(family, values, overrides)
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from None
