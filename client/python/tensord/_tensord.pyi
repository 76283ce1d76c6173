# The C++ half of the package (tensord._tensord): used through tensord's public names, which
# __init__.pyi types. Everything here is Any to the package's own Python modules.
from typing import Any

def __getattr__(name: str) -> Any: ...
