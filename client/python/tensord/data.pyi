from typing import Any, Iterable, Iterator, Optional

from . import Client

class Batch:
    structure: Any
    def __init__(self, structure: Any) -> None: ...
    def names(self) -> list[str]: ...
    def take(self, client: Client, timeout: Optional[float] = 60.0) -> Any: ...

class CollateIntoBroker:
    client: Client
    prefix: str
    ns: str
    ttl: Optional[float]
    def __init__(
        self, client: Client, prefix: str, ns: Optional[str] = None, ttl: Optional[float] = None
    ) -> None: ...
    def __call__(self, samples: Iterable[Any]) -> Batch: ...

def taken(loader: Iterable[Any], client: Client, timeout: Optional[float] = 60.0) -> Iterator[Any]: ...
