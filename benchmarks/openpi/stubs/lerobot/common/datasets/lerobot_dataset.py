"""The two names openpi's data loader reads from lerobot; both refuse to be built (fake data only)."""

from typing import Any

_WHY = "lerobot stand-in (benchmarks/openpi/stubs): only openpi's fake data (repo_id='fake') is supported here"


class LeRobotDatasetMetadata:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(_WHY)


class LeRobotDataset:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(_WHY)
