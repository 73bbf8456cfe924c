"""Whether a plugin supports the running vLLM release."""

from __future__ import annotations

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version


def unsupported_vllm(plugin: str, supported: str, vllm_version: str) -> str | None:
    """A one-line warning if `supported` (a PEP 440 specifier set) excludes `vllm_version`,
    else None.

    Local and pre-release tags count as their release (`0.32.0+cpu` as 0.32.0, `0.33.0rc1`
    as 0.33.0); a version that does not parse is unsupported.
    """
    try:
        release = Version(vllm_version).base_version
    except InvalidVersion:
        release = None
    if release is not None and SpecifierSet(supported).contains(release):
        return None
    return f"{plugin} supports vLLM {supported}; running {vllm_version}"
